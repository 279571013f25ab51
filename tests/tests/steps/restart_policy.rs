//! Steps under the restart policy (`restart_steps_after_failure`) against failures that are not the
//! body's own `Err`: a resuming claim renewed and then given up, a library error passed up with `?`
//! (a value that no longer reads back, no room for a step's mark, a step that staged writes), a
//! completion that cannot commit. None of them may start the operation over: each asserts how often
//! each step's effect ran and what the record holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck};
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{
    Change, ClaimOutcome, ClaimRequest, StepsClaim, Transition, WriteOutcome,
};
use idempotent_runtime::{Error, ManualClock, MemoryStore, Operation, Store, StoreError};
use idempotent_tests::{AppError, Backend, Effects, Harness, RequestCounter};

const NAMESPACE: &str = "steps-restart::checkout";
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

/// A two-step checkout: "reserve" (a `u32`) then "charge"; `hang`: the charge never finishes (the
/// call is cut off there, after the reserve was stored).
async fn checkout(
    harness: &Harness,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
    hang: bool,
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
            let id = steps
                .run("charge", || async {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    effects.happened("charge");
                    Ok::<_, AppError>(format!("ch_{}", &key[..8]))
                })
                .await?;
            Ok((hold, id))
        })
        .await
}

/// The checkout is cut off in its charge, after its reserve was stored, and its lease lapses.
async fn crash_after_reserve(
    harness: &Harness,
    order: &str,
    restart: bool,
    effects: &Arc<Effects>,
) {
    let call = checkout(harness, order, restart, effects, true);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .is_err(),
        "the charge hangs"
    );
    assert_eq!(effects.runs("reserve"), 1, "the reserve ran");
    harness.clock.advance(PAST_THE_LEASE);
}

/// The next resuming claim lands, but its answer comes after the lease it asked for (the clock
/// moves past it while the request is out); the renewal that follows it fails (`Unavailable`).
#[derive(Debug, Default)]
struct LateResumeThenRenewFails {
    clock: OnceLock<ManualClock>,
    armed: AtomicBool,
    renewing: AtomicBool,
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for LateResumeThenRenewFails {
    fn kind(&self) -> &'static str {
        "late-resume-then-renew-fails"
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await?;
        if matches!(request.steps, StepsClaim::Resume { .. })
            && matches!(outcome, ClaimOutcome::Claimed)
            && self.armed.swap(false, Ordering::SeqCst)
        {
            self.clock.get().expect("the clock").advance(PAST_THE_LEASE);
            self.renewing.store(true, Ordering::SeqCst);
        }
        Ok(outcome)
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        if matches!(transition.change, Change::ExtendLease { .. })
            && self.renewing.swap(false, Ordering::SeqCst)
        {
            return Err(StoreError::Unavailable("renewal lost".into()));
        }
        inner.transition(transition).await
    }
}

/// Under the restart policy: a checkout is cut off after its reserve. The next call's resuming claim
/// lands (the record holds the reserve, under the call's token), but its answer is late, so the call
/// renews it; the renewal fails and the call gives up while its claim's fate is unknown. A resuming
/// claim of an operation that restarts after failures must lapse, not be released: a release is a
/// FAILED record, which the next call reads as a failure to start over after, running the finished
/// reserve again under a new `Steps::key`.
#[tokio::test]
async fn a_late_resume_given_up_during_its_renewal_does_not_restart_the_steps() {
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        LateResumeThenRenewFails::default(),
    ));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    store.with.clock.set(harness.clock.clone()).unwrap();
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    store.with.armed.store(true, Ordering::SeqCst);
    let second = checkout(&harness, "order-1", true, &effects, false).await;
    let _ = harness.idem.drain(Duration::from_secs(5)).await;
    assert!(
        !store.with.armed.load(Ordering::SeqCst),
        "the resume was answered late"
    );
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_second = (record.status, record.error.clone());

    harness.clock.advance(PAST_THE_LEASE);
    let third = checkout(&harness, "order-1", true, &effects, false).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (second call {second:?} left {after_second:?}; third {third:?})"
    );
    let keys = effects.keys("reserve");
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "Steps::key changed within the operation"
    );
}

/// While `late` is on, every resuming claim and every renewal lands, but is answered after the
/// lease it asked for (the clock moves past it while the request is out).
#[derive(Debug, Default)]
struct AnswersLate {
    clock: OnceLock<ManualClock>,
    late: AtomicBool,
    renewals: AtomicUsize,
}

impl AnswersLate {
    fn later(&self) {
        if self.late.load(Ordering::SeqCst) {
            self.clock.get().expect("the clock").advance(PAST_THE_LEASE);
        }
    }
}

#[async_trait::async_trait]
impl<S: Store> Override<S> for AnswersLate {
    fn kind(&self) -> &'static str {
        "answers-late"
    }

    async fn claim(
        &self,
        inner: &S,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await?;
        if matches!(request.steps, StepsClaim::Resume { .. }) {
            self.later();
        }
        Ok(outcome)
    }

    async fn transition(
        &self,
        inner: &S,
        transition: &Transition<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let outcome = inner.transition(transition).await?;
        if matches!(transition.change, Change::ExtendLease { .. }) {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            self.later();
        }
        Ok(outcome)
    }
}

/// Under the restart policy: a checkout is cut off after its reserve. The next call's resuming claim
/// and both its renewals land, each answered too late to use: the call gives up (`Contended`), and
/// releases its claim as FAILED. No request failed and nothing was refused; the finished reserve must
/// not run again, yet the next call reads the release as a failure to start over after.
#[tokio::test]
async fn a_resume_whose_answers_all_come_late_does_not_restart_the_steps() {
    answers_late(MemoryStore::new()).await;
}

/// [`a_resume_whose_answers_all_come_late_does_not_restart_the_steps`] on DynamoDB Local.
#[tokio::test]
async fn a_resume_whose_answers_all_come_late_does_not_restart_the_steps_on_dynamodb() {
    answers_late(idempotent_tests::dynamodb_store().await.0).await;
}

/// Without the restart policy, the same sequence holds: the resume whose answers all came late is
/// released (FAILED with the finished reserve), and the next call resumes it under the same
/// `Steps::key`s, running only the charge.
#[tokio::test]
async fn a_resume_whose_answers_all_come_late_resumes_without_the_restart_policy() {
    let store = Arc::new(Delegating::new(MemoryStore::new(), AnswersLate::default()));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    store.with.clock.set(harness.clock.clone()).unwrap();
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", false, &effects).await;

    store.with.late.store(true, Ordering::SeqCst);
    let second = checkout(&harness, "order-1", false, &effects, false).await;
    store.with.late.store(false, Ordering::SeqCst);
    let _ = harness.idem.drain(Duration::from_secs(5)).await;
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::Contended { .. }), "{err:?}");

    harness.clock.advance(PAST_THE_LEASE);
    let third = checkout(&harness, "order-1", false, &effects, false).await;
    assert!(third.is_ok(), "{third:?}");
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 1));
    let keys = effects.keys("reserve");
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
}

/// The sequence of [`a_resume_whose_answers_all_come_late_does_not_restart_the_steps`] on `inner`.
async fn answers_late<S: Store>(inner: S) {
    let store = Arc::new(Delegating::new(inner, AnswersLate::default()));
    let harness = Harness::over(store.clone(), RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    store.with.clock.set(harness.clock.clone()).unwrap();
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    store.with.late.store(true, Ordering::SeqCst);
    let second = checkout(&harness, "order-1", true, &effects, false).await;
    store.with.late.store(false, Ordering::SeqCst);
    let _ = harness.idem.drain(Duration::from_secs(5)).await;
    assert!(
        store.with.renewals.load(Ordering::SeqCst) >= 1,
        "the resume was renewed"
    );
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::Contended { .. }), "{err:?}");
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_second = (record.status, record.error.clone());

    harness.clock.advance(PAST_THE_LEASE);
    let third = checkout(&harness, "order-1", true, &effects, false).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (second call left {after_second:?}; third {third:?})"
    );
}

/// A body whose "reserve" step now returns a `String` (a deploy changed its type), then "charge".
async fn checkout_with_string_reserve(
    harness: &Harness,
    order: &str,
    effects: &Arc<Effects>,
) -> Result<String, AppError> {
    operation(harness, order, true)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let hold = steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>("hold-17".to_owned())
                })
                .await?;
            steps
                .run("charge", || async {
                    effects.happened("charge");
                    Ok::<_, AppError>(hold)
                })
                .await
        })
        .await
}

/// Under the restart policy: a checkout is cut off after its reserve (a `u32`); a deploy changes the
/// reserve's type to `String`. The guide's table: a stored value that no longer reads as the step's
/// type is `StepValue` at that step, every call, under either policy. The `StepValue` the body passes
/// up with `?` must not count as the body's own failure: a FAILED record would make the next call
/// start over and run the finished reserve again.
#[tokio::test]
async fn a_changed_step_type_under_the_restart_policy_never_runs_the_step_again() {
    let harness = Harness::with(Backend::Memory, |b| b.failed_ttl(FAILED_TTL)).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&harness, "order-1", true, &effects).await;

    let second = checkout_with_string_reserve(&harness, "order-1", &effects).await;
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepValue { .. }), "{err:?}");
    let third = checkout_with_string_reserve(&harness, "order-1", &effects).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (third call {third:?})"
    );
    let err = idempotent_tests::idem_error(third);
    assert!(matches!(err, Error::StepValue { .. }), "{err:?}");
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

/// A "fill" step returning `fill` characters (its runs counted), then, with `export`, an "export"
/// step (its runs counted too); with the restart policy when `restart`.
async fn fill_then_export(
    harness: &Harness,
    order: &str,
    restart: bool,
    fill: usize,
    export: bool,
    effects: &Arc<Effects>,
) -> Result<usize, AppError> {
    operation(harness, order, restart)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            let a = steps
                .run("fill", || async {
                    effects.happened("fill");
                    Ok::<_, AppError>(incompressible(fill))
                })
                .await?;
            if export {
                steps
                    .run("export", || async {
                        effects.happened("export");
                        Ok::<_, AppError>(1_u8)
                    })
                    .await?;
            }
            Ok(a.len())
        })
        .await
}

/// Under the restart policy: a "fill" step's value is stored and leaves the record with no room for
/// the next step's mark, so the "export" step is refused before it runs (`StepTooLarge`). The
/// guide's table: then nothing runs again, every call, under either policy. The refusal the body
/// passes up with `?` is no failure the body undid its steps after: a FAILED record would make the
/// next call start over and run the finished fill again.
#[tokio::test]
async fn no_room_for_a_steps_mark_under_the_restart_policy_never_runs_a_step_again() {
    let harness = Harness::with(Backend::Memory, |b| b.failed_ttl(FAILED_TTL)).await;
    let probes = Arc::new(Effects::default());
    // The largest fill that is stored alone, by bisection on fresh keys.
    let (mut fits, mut too_large) = (1_000, 1_000_000);
    while too_large - fits > 1 {
        let mid = usize::midpoint(fits, too_large);
        let order = format!("probe-{mid}");
        match fill_then_export(&harness, &order, false, mid, false, &probes).await {
            Ok(_) => fits = mid,
            Err(AppError::Idempotency(Error::StepTooLarge { .. })) => too_large = mid,
            Err(other) => panic!("{other:?}"),
        }
    }

    // A few characters under the largest: each call's origin token is new, and changes the
    // compressed steps by a few bytes; the export's mark needs hundreds.
    let fits = fits - 64;
    let effects = Arc::new(Effects::default());
    let first = fill_then_export(&harness, "order-1", true, fits, true, &effects).await;
    let err = idempotent_tests::idem_error(first);
    assert!(
        matches!(&err, Error::StepTooLarge { step, .. } if step == "export"),
        "{err:?}"
    );
    assert_eq!((effects.runs("fill"), effects.runs("export")), (1, 0));
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_first = (record.status, record.error.clone());

    let second = fill_then_export(&harness, "order-1", true, fits, true, &effects).await;
    assert_eq!(
        effects.runs("fill"),
        1,
        "the finished fill ran again (first call left {after_first:?}; second call {second:?})"
    );
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepTooLarge { .. }), "{err:?}");
}

/// The `inventory` table of the memory store's business tables, with one apple.
fn inventory(harness: &Harness) {
    let memory = harness.memory.as_ref().expect("a memory harness");
    memory
        .create_table("inventory", "sku", None)
        .expect("a table");
    memory
        .put_item(
            "inventory",
            HashMap::from([
                ("sku".to_owned(), AttributeValue::S("apple".into())),
                ("available".to_owned(), AttributeValue::N("0".into())),
            ]),
        )
        .expect("an apple");
}

/// A check that the apple is in stock (it is not: the completion's transaction is canceled).
fn in_stock() -> ConditionCheck {
    ConditionCheck::builder()
        .table_name("inventory")
        .key("sku", AttributeValue::S("apple".into()))
        .condition_expression("available > :zero")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .build()
        .expect("a condition check")
}

/// Under the restart policy, with `.steps().transact()`: a "charge" step runs, then the body stages a
/// condition the completion's transaction fails (out of stock) and returns `Ok`. The completion is
/// canceled and recorded as FAILED. The body returned no `Err` and undid nothing after its charge;
/// the next call must not start over and charge again.
#[tokio::test]
async fn a_canceled_completion_under_the_restart_policy_never_runs_a_step_again() {
    let harness = Harness::with(Backend::Memory, |b| b.failed_ttl(FAILED_TTL)).await;
    inventory(&harness);
    let charges = Arc::new(AtomicUsize::new(0));
    let call = || {
        let charges = charges.clone();
        operation(&harness, "order-1", true)
            .steps()
            .transact()
            .run(move |cx| async move {
                let (steps, tx) = cx.into_parts();
                let id = steps
                    .run("charge", || async {
                        charges.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, AppError>(7_u32)
                    })
                    .await?;
                tx.condition_check(in_stock());
                Ok::<_, AppError>(id)
            })
    };
    let first = call().await;
    let err = idempotent_tests::idem_error(first);
    assert!(matches!(err, Error::TransactionCanceled { .. }), "{err:?}");
    let record = harness.record(NAMESPACE, "order-1").await.unwrap();
    let after_first = (record.status, record.error.clone());

    let second = call().await;
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the finished charge ran again (first call left {after_first:?}; second call {second:?})"
    );
}

/// A store without transactions: every request goes to the memory store's records, and
/// `transact_transition` is the `Store` trait's default (`Unsupported`).
#[derive(Debug, Default)]
struct NoTransactions;

#[async_trait::async_trait]
impl<S: Store> Override<S> for NoTransactions {
    fn kind(&self) -> &'static str {
        "no-transactions"
    }
}

/// Under the restart policy, with `.steps().transact()` on a store without transactions: a "charge"
/// step runs, the body stages a write and returns `Ok`, and the completion fails with `Unsupported`
/// (a set-up error, recorded as FAILED). The body undid nothing after its charge; no call may charge
/// again, however often the caller retries.
#[tokio::test]
async fn an_unsupported_completion_under_the_restart_policy_never_runs_a_step_again() {
    let store = Arc::new(Delegating::new(MemoryStore::new(), NoTransactions));
    let harness = Harness::over(store, RequestCounter::default(), |b| {
        b.failed_ttl(FAILED_TTL)
    });
    let charges = Arc::new(AtomicUsize::new(0));
    let call = || {
        let charges = charges.clone();
        operation(&harness, "order-1", true)
            .steps()
            .transact()
            .run(move |cx| async move {
                let (steps, tx) = cx.into_parts();
                let id = steps
                    .run("charge", || async {
                        charges.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, AppError>(7_u32)
                    })
                    .await?;
                tx.condition_check(in_stock());
                Ok::<_, AppError>(id)
            })
    };
    let mut errors = Vec::new();
    for _ in 0..3 {
        errors.push(call().await.map_err(|e| format!("{e:?}")));
    }
    assert_eq!(
        charges.load(Ordering::SeqCst),
        1,
        "the finished charge ran again (calls got {errors:?})"
    );
}

/// Under the restart policy, one body runs an at-most-once "email" and a "charge" side by side
/// (`try_join`): the charge returns the body's own `Err` while the email's effect is under way, and
/// the body ends, dropping the email. The record holds the email as started: the operation is
/// pinned, and the next call stops at the email (`StepInterrupted`) instead of starting over.
#[tokio::test]
async fn a_failure_beside_an_at_most_once_step_under_way_does_not_restart() {
    let harness = Harness::with(Backend::Memory, |b| b.failed_ttl(FAILED_TTL)).await;
    let effects = Arc::new(Effects::default());
    let call = |first: bool| {
        let effects = effects.clone();
        operation(&harness, "order-1", true)
            .steps()
            .run(move |cx| async move {
                let (steps, ()) = cx.into_parts();
                steps
                    .run("reserve", || async {
                        effects.happened("reserve");
                        Ok::<_, AppError>(1_u32)
                    })
                    .await?;
                let email = steps.run_at_most_once("email", || async {
                    effects.happened("email");
                    if first {
                        std::future::pending::<()>().await;
                    }
                    Ok::<_, AppError>(2_u32)
                });
                let charge = async {
                    // Lets the email start (its mark written, its effect under way) first.
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    if first {
                        return Err::<u32, _>(AppError::Declined);
                    }
                    steps
                        .run("charge", || async {
                            effects.happened("charge");
                            Ok::<_, AppError>(3_u32)
                        })
                        .await
                };
                let (e, c) = futures_util::try_join!(email, charge)?;
                Ok::<_, AppError>(e + c)
            })
    };
    let first = call(true).await;
    assert!(matches!(first, Err(AppError::Declined)), "{first:?}");
    assert_eq!(effects.runs("email"), 1, "the email started");
    let second = call(false).await;
    assert_eq!(
        (effects.runs("reserve"), effects.runs("email")),
        (1, 1),
        "second call {second:?}"
    );
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepInterrupted { .. }), "{err:?}");
}

/// A reserve, then a "hold" step that stages a business write inside it, then a charge that hangs
/// when `hang` (the call is cut off there); with the restart policy.
async fn stage_inside_a_step(
    harness: &Harness,
    effects: &Arc<Effects>,
    hang: bool,
) -> Result<u32, AppError> {
    let effects = effects.clone();
    operation(harness, "order-1", true)
        .steps()
        .transact()
        .run(move |cx| async move {
            let (steps, tx) = cx.into_parts();
            steps
                .run("reserve", || async {
                    effects.happened("reserve");
                    Ok::<_, AppError>(1_u32)
                })
                .await?;
            steps
                .run("hold", || async {
                    tx.put(
                        idempotent_runtime::aws_sdk_dynamodb::types::Put::builder()
                            .table_name("inventory")
                            .item("sku", AttributeValue::S("hold#order-1".into()))
                            .build()
                            .expect("a put"),
                    );
                    Ok::<_, AppError>(2_u32)
                })
                .await?;
            steps
                .run("charge", || async {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    effects.happened("charge");
                    Ok::<_, AppError>(3_u32)
                })
                .await
        })
        .await
}

/// Under the restart policy, with `.steps().transact()`: a call is cut off after a step that staged a
/// business write. The guide's table: the next call stops at that step (`StepStagedWrites`), and so
/// does every later one ("the same" under the restart policy: the cut-off call did not fail). The
/// `StepStagedWrites` the body passes up with `?` is recorded as its failure, and the third call
/// starts over, running the finished reserve again.
#[tokio::test]
async fn a_step_that_staged_writes_under_the_restart_policy_never_restarts_after_a_crash() {
    let harness = Harness::with(Backend::Memory, |b| b.failed_ttl(FAILED_TTL)).await;
    inventory(&harness);
    let effects = Arc::new(Effects::default());
    let cut_off = stage_inside_a_step(&harness, &effects, true);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), cut_off)
            .await
            .is_err(),
        "the charge hangs"
    );
    harness.clock.advance(PAST_THE_LEASE);

    let second = stage_inside_a_step(&harness, &effects, false).await;
    let err = idempotent_tests::idem_error(second);
    assert!(matches!(err, Error::StepStagedWrites { .. }), "{err:?}");
    let third = stage_inside_a_step(&harness, &effects, false).await;
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the finished reserve ran again (third call {third:?})"
    );
}
