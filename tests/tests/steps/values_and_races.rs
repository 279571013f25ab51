//! Steps (`Operation::steps`) under attack: regression tests for the behaviours that broke the
//! feature's promise, each of which failed before its fix.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{Transition, WriteOutcome};
use idempotent_runtime::{Clock as _, Error, Idempotency, MemoryStore, Status, Store, StoreError};
use idempotent_tests::{AppError, Backend, Effects, Harness, RequestCounter, SlowResume};
use tokio::sync::Notify;

const NAMESPACE: &str = "steps-values::checkout";
const LEASE: Duration = Duration::from_secs(30);

/// A two-step body: "reserve" (its effect counted), then "charge", which hangs when `hang` (the call is
/// then dropped: a crash after the reserve) and otherwise succeeds.
async fn two_steps(
    idem: &Idempotency,
    order: &str,
    restart_after_failure: bool,
    effects: &Arc<Effects>,
    hang: bool,
    reserved: Option<&Notify>,
) -> Result<u32, AppError> {
    let operation = idem.operation(NAMESPACE, order).lease(LEASE);
    let operation = if restart_after_failure {
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
            if let Some(reserved) = reserved {
                reserved.notify_one();
            }
            steps
                .run("charge", || async {
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    effects.happened("charge");
                    Ok::<_, AppError>(hold + 1)
                })
                .await
        })
        .await
}

/// Runs `two_steps` with a charge that never finishes, and drops the call once the reserve is stored:
/// the record is left PENDING with one finished step, as a crash leaves it.
async fn crash_after_reserve(h: &Harness, order: &str, restart: bool, effects: &Arc<Effects>) {
    let reserved = Notify::new();
    tokio::select! {
        _ = two_steps(&h.idem, order, restart, effects, true, Some(&reserved)) => panic!("the charge hangs"),
        () = reserved.notified() => {}
    }
    let record = h.record(NAMESPACE, order).await.unwrap();
    assert_eq!(record.status, Status::Pending);
    assert!(record.steps.is_some());
}

/// The store of `backend`, bare (no harness around it), with its request counter.
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

/// A step value: `len` pseudo-random hex digits (xorshift), which compress about 2:1.
fn noise(len: usize, seed: u64) -> String {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ seed;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from_digit((state % 16) as u32, 16).unwrap()
        })
        .collect()
}

/// An error whose text is long (an SDK's error chain, a validation report).
#[derive(Debug)]
enum LongError {
    Long(String),
    Idempotency(Error),
}

impl From<Error> for LongError {
    fn from(e: Error) -> Self {
        LongError::Idempotency(e)
    }
}

impl std::fmt::Display for LongError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LongError::Long(text) => f.write_str(text),
            LongError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// A crash after the first step, then a resume whose caller gave up while its claim was
/// in flight (the claim landed; the dropped call released it, as `Drop for Attempt`
/// does). Nothing failed: no body returned `Err`, so the next call must resume and not
/// run the finished step again, even for an operation that restarts after a failure.
async fn a_released_resume_is_not_a_failure_to_restart_after(backend: Backend) {
    let (inner, counter) = bare_store(backend).await;
    let slow = Arc::new(SlowResume::new(inner));
    let h = Harness::over(slow.clone(), counter, |b| b.default_lease(LEASE));
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-1", true, &effects).await;
    assert_eq!(effects.runs("reserve"), 1);

    // The lease lapsed: a retry resumes; its claim lands, but its caller gives up before
    // hearing so.
    h.clock.advance(LEASE * 2);
    slow.hold(true);
    tokio::select! {
        _ = two_steps(&h.idem, "r-1", true, &effects, false, None) => {
            panic!("the resume's answer was held back")
        }
        () = slow.landed() => {}
    }
    slow.hold(false);
    // Such a claim is not released (a release is a FAILED record, which the operation
    // would restart after): it lapses with its lease.
    h.idem.drain(Duration::from_secs(5)).await;
    let kept = h.record(NAMESPACE, "r-1").await.unwrap();
    assert_eq!(kept.status, Status::Pending, "{kept:?}");
    h.clock.advance(LEASE * 2);

    // The next retry: the operation never failed, it crashed; it resumes at the charge.
    let charged = two_steps(&h.idem, "r-1", true, &effects, false, None)
        .await
        .unwrap();
    assert_eq!(charged, 18);
    assert_eq!(effects.runs("charge"), 1);
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the reserve, finished before the crash, ran again"
    );
}

/// An operator releases the PENDING claim a crash left behind (`idempotent key
/// release`). A retry an hour and a half later, well within the operation's ttl, must
/// resume: the finished reserve is not run again. A failed body with steps keeps its
/// record for the ttl for exactly this reason, and so must the operator's release.
async fn an_operators_release_keeps_the_finished_steps_for_the_ttl(backend: Backend) {
    let h = Harness::with(backend, |b| b.default_lease(LEASE)).await;
    let effects = Arc::new(Effects::default());
    crash_after_reserve(&h, "r-2", false, &effects).await;
    let record = h.record(NAMESPACE, "r-2").await.unwrap();
    let released = idempotent_runtime::admin::release(h.store.as_ref(), &record, h.clock.now_ms())
        .await
        .unwrap();
    // A record with steps is not failed: its lease lapses, and it keeps its steps.
    assert!(matches!(
        released,
        idempotent_runtime::admin::Released::Lapsed
    ));

    h.clock.advance(Duration::from_mins(90));
    let charged = two_steps(&h.idem, "r-2", false, &effects, false, None)
        .await
        .unwrap();
    assert_eq!(charged, 18);
    assert_eq!(
        effects.runs("reserve"),
        1,
        "the reserve, finished before the crash, ran again"
    );
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_released_resume_is_not_a_failure_to_restart_after,
    #[tokio::test]
    an_operators_release_keeps_the_finished_steps_for_the_ttl,
}

/// The longest `noise` value that still fits as the one step of an operation in `NAMESPACE` (within
/// 64 digits), found on a memory store: the same budget as a DynamoDB store with the default
/// attribute names (the derived keys have the same length).
async fn longest_step_value() -> usize {
    let probe = Harness::with(Backend::Memory, |b| b.default_lease(LEASE)).await;
    let fits = |len: usize| {
        let idem = probe.idem.clone();
        async move {
            let result = idem
                .operation(NAMESPACE, &format!("probe-{len}"))
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    steps
                        .run("big", || async move { Ok::<_, AppError>(noise(len, 1)) })
                        .await
                        .map(|big| big.len())
                })
                .await;
            match result {
                Ok(_) => true,
                Err(AppError::Idempotency(Error::StepTooLarge { .. })) => false,
                Err(other) => panic!("{other:?}"),
            }
        }
    };
    let (mut low, mut high) = (100_000_usize, 2_000_000_usize);
    assert!(fits(low).await && !fits(high).await);
    while high - low > 64 {
        let mid = low + (high - low) / 2;
        if fits(mid).await {
            low = mid;
        } else {
            high = mid;
        }
    }
    low
}

/// A body whose finished steps take most of the record's budget (the step check accepts
/// them: they fit a PENDING record), then fails with a long error text (up to the 4 KB
/// the library keeps). The failure must be recorded: the key is FAILED, free at once.
async fn failure_after_large_steps(backend: Backend) {
    let h = Harness::with(backend, |b| b.default_lease(LEASE)).await;
    let len = longest_step_value().await - 64;
    let long = "x".repeat(4000);
    let failed = h
        .idem
        .operation(NAMESPACE, "r-3")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("big", || async move { Ok::<_, LongError>(noise(len, 1)) })
                .await?;
            Err::<(), _>(LongError::Long(long))
        })
        .await;
    assert!(matches!(failed, Err(LongError::Long(_))), "{failed:?}");
    let record = h.record(NAMESPACE, "r-3").await.unwrap();
    assert_eq!(
        record.status,
        Status::Failed,
        "the failure was not recorded (the key stays held until its lease lapses)"
    );
}

/// Holds on the memory store, which has no item size limit.
#[tokio::test]
async fn a_failure_after_large_steps_is_recorded_on_memory() {
    failure_after_large_steps(Backend::Memory).await;
}

/// DynamoDB refuses the FAILED record: the finished steps (accepted by the step check, which budgets
/// a COMPLETED record's response) plus the error text exceed 400 KB. The failure write is a
/// `ValidationException`, the record stays PENDING until its lease lapses.
#[tokio::test]
async fn a_failure_after_large_steps_is_recorded_on_dynamodb() {
    failure_after_large_steps(Backend::DynamoDb).await;
}

/// A step's value goes through `serde_json::Value` (parsed from its JSON) when it is stored, while a
/// plain response is decoded from its JSON text: a `u128` beyond `u64` becomes a float in the
/// `Value`, and no longer deserializes. The retry after a failure then fails at the replay of that
/// step, every time, for the record's whole ttl (a failed steps body resumes).
#[tokio::test]
async fn a_u128_step_value_replays() {
    let h = Harness::with(Backend::Memory, |b| b.default_lease(LEASE)).await;
    let big: u128 = u128::from(u64::MAX) * 1_000 + 7;
    // As a plain response the value round-trips.
    let plain = |idem: Idempotency| async move {
        idem.operation(NAMESPACE, "plain")
            .run(|_| async move { Ok::<_, AppError>(big) })
            .await
    };
    assert_eq!(plain(h.idem.clone()).await.unwrap(), big);
    assert_eq!(
        plain(h.idem.clone()).await.unwrap(),
        big,
        "the plain replay"
    );

    let call = |fail: bool| {
        let idem = h.idem.clone();
        async move {
            idem.operation(NAMESPACE, "u128")
                .steps()
                .run(|cx| async move {
                    let (steps, ()) = cx.into_parts();
                    let amount: u128 = steps
                        .run("amount", || async move { Ok::<_, AppError>(big) })
                        .await?;
                    if fail {
                        return Err(AppError::Declined);
                    }
                    Ok(amount)
                })
                .await
        }
    };
    assert!(matches!(call(true).await, Err(AppError::Declined)));
    let resumed = call(false).await;
    assert_eq!(
        resumed.map_err(|e| e.to_string()),
        Ok(big),
        "the replayed step"
    );
}

/// With `.steps().transact()`, a business write staged inside a step cannot be staged again when that
/// step is replayed: the resumed call must not complete the operation (COMPLETED, the response replayed
/// from now on) without ever committing it. Either the write commits, or the library refuses to
/// complete: it refuses, with `StepStagedWrites`, and the order step does not run again.
#[tokio::test]
async fn a_write_staged_in_a_replayed_step_is_not_lost() {
    use idempotent_runtime::aws_sdk_dynamodb::types::{AttributeValue, Put};
    let memory = Arc::new(idempotent_runtime::MemoryStore::new());
    memory.create_table("orders", "pk", None).unwrap();
    let h = Harness::over(memory.clone(), RequestCounter::default(), |b| {
        b.default_lease(LEASE)
    });
    let effects = Arc::new(Effects::default());
    let call = |hang: bool, reserved: Option<Arc<Notify>>| {
        let (idem, effects) = (h.idem.clone(), effects.clone());
        async move {
            idem.operation(NAMESPACE, "staged")
                .steps()
                .transact()
                .run(|cx| async move {
                    let (steps, tx) = cx.into_parts();
                    let order = steps
                        .run("order", || async {
                            effects.happened("order");
                            tx.put(
                                Put::builder()
                                    .table_name("orders")
                                    .item("pk", AttributeValue::S("order-1".into()))
                                    .build()
                                    .unwrap(),
                            );
                            Ok::<_, AppError>(String::from("order-1"))
                        })
                        .await?;
                    if let Some(reserved) = reserved {
                        reserved.notify_one();
                    }
                    steps
                        .run("charge", || async {
                            if hang {
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, AppError>(format!("charged {order}"))
                        })
                        .await
                })
                .await
        }
    };
    let reserved = Arc::new(Notify::new());
    tokio::select! {
        _ = call(true, Some(reserved.clone())) => panic!("the charge hangs"),
        () = reserved.notified() => {}
    }
    h.clock.advance(LEASE * 2);
    let refused = call(false, None).await;
    assert!(
        matches!(&refused, Err(AppError::Idempotency(Error::StepStagedWrites { step, .. })) if step == "order"),
        "{refused:?}"
    );
    assert_eq!(effects.runs("order"), 1);
    let record = h.record(NAMESPACE, "staged").await.unwrap();
    assert_ne!(
        record.status,
        Status::Completed,
        "the operation completed without the write its order step staged"
    );
    let key = HashMap::from([("pk".to_owned(), AttributeValue::S("order-1".into()))]);
    assert!(memory.get_item("orders", &key).is_none());
    // A call that completes in one go commits what its steps staged.
    let whole = idempotent_runtime::Idempotency::builder_arc(memory.clone()).build();
    let committed = whole
        .operation(NAMESPACE, "staged-whole")
        .steps()
        .transact()
        .run(|cx| async move {
            let (steps, tx) = cx.into_parts();
            steps
                .run("order", || async {
                    tx.put(
                        Put::builder()
                            .table_name("orders")
                            .item("pk", AttributeValue::S("order-2".into()))
                            .build()
                            .unwrap(),
                    );
                    Ok::<_, AppError>(2_u32)
                })
                .await
        })
        .await;
    assert_eq!(committed.unwrap(), 2);
    let key = HashMap::from([("pk".to_owned(), AttributeValue::S("order-2".into()))]);
    assert!(memory.get_item("orders", &key).is_some());
}

/// Pins: two callers racing to resume the same crashed operation: exactly one takes it over, and
/// the finished step is replayed, never run again.
#[tokio::test]
async fn two_callers_race_to_resume_and_run_the_finished_step_once() {
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::with(backend, |b| b.default_lease(LEASE)).await;
        let effects = Arc::new(Effects::default());
        crash_after_reserve(&h, "race", false, &effects).await;
        h.clock.advance(LEASE * 2);
        // The callers are in two processes: in one (one handle), the second would follow the first
        // (coalescing) and never reach the store.
        let other = h.another_process(|b| b.default_lease(LEASE));
        let (a, b) = tokio::join!(
            two_steps(&h.idem, "race", false, &effects, false, None),
            two_steps(&other, "race", false, &effects, false, None),
        );
        let ok = [&a, &b].iter().filter(|r| r.is_ok()).count();
        assert!(ok >= 1, "{a:?} {b:?}");
        assert_eq!(effects.runs("reserve"), 1, "{backend:?}");
        assert_eq!(effects.runs("charge"), 1, "{backend:?}");
    }
}

/// Pins: a step write whose response is lost (the write landed; the store then reports a transient
/// fault) is retried and lands again harmlessly; the body goes on.
#[tokio::test]
async fn a_lost_step_response_is_harmless() {
    #[derive(Debug)]
    struct LoseOneStep {
        lost: AtomicUsize,
    }
    #[async_trait::async_trait]
    impl Override<MemoryStore> for LoseOneStep {
        fn kind(&self) -> &'static str {
            "lose-one-step"
        }
        async fn transition(
            &self,
            inner: &MemoryStore,
            transition: &Transition<'_>,
        ) -> Result<WriteOutcome, StoreError> {
            let outcome = inner.transition(transition).await?;
            if matches!(
                transition.change,
                idempotent_runtime::store::Change::SaveSteps { .. }
            ) && self.lost.fetch_add(1, Ordering::SeqCst) == 0
            {
                return Err(StoreError::Unavailable("response lost".into()));
            }
            Ok(outcome)
        }
    }
    let store = Arc::new(Delegating::new(
        MemoryStore::new(),
        LoseOneStep {
            lost: AtomicUsize::new(0),
        },
    ));
    let h = Harness::over(store, RequestCounter::default(), |b| b.default_lease(LEASE));
    let effects = Arc::new(Effects::default());
    assert_eq!(
        two_steps(&h.idem, "lost", false, &effects, false, None)
            .await
            .unwrap(),
        18
    );
    assert_eq!((effects.runs("reserve"), effects.runs("charge")), (1, 1));
}

/// Without a record (a missing key under `MissingKey::Skip`; the kill switch takes the same path)
/// a body "just runs its steps": nothing is stored, so a step value need not serialize. A plain
/// `run` under `Skip` returns a NaN as it is; a step refuses it with `Error::Serialize`, after its
/// effect happened.
#[tokio::test]
async fn a_step_without_a_record_returns_any_value() {
    let h = Harness::with(Backend::Memory, |b| b.default_lease(LEASE)).await;
    let plain = h
        .idem
        .operation(NAMESPACE, &None::<String>)
        .missing_key(idempotent_runtime::MissingKey::Skip)
        .run(|_| async { Ok::<_, AppError>(f64::NAN) })
        .await;
    assert!(plain.unwrap().is_nan(), "a plain body without a record");
    let effects = &Arc::new(Effects::default());
    let stepped = h
        .idem
        .operation(NAMESPACE, &None::<String>)
        .missing_key(idempotent_runtime::MissingKey::Skip)
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("measure", || async {
                    effects.happened("measure");
                    Ok::<_, AppError>(f64::NAN)
                })
                .await
        })
        .await;
    assert_eq!(effects.runs("measure"), 1);
    assert!(
        stepped.as_ref().is_ok_and(|v| v.is_nan()),
        "a step without a record: {stepped:?}"
    );
}

/// Pins: a crash after a step that takes nearly the whole budget, then a resume: the resuming claim
/// carries the whole stored steps in its condition (`#sp = :sp`), and is accepted. (The step leaves
/// room for the next one's mark, which a step needs before it runs: about 650 bytes, where 4096 of
/// these hex characters compress to about 2 KB.)
#[tokio::test]
async fn a_resume_of_steps_at_the_budget_is_accepted() {
    let len = longest_step_value().await - 64 - 4096;
    for backend in [Backend::Memory, Backend::DynamoDb] {
        let h = Harness::with(backend, |b| b.default_lease(LEASE)).await;
        let effects = Arc::new(Effects::default());
        let call = |hang: bool, reserved: Option<Arc<Notify>>| {
            let (idem, effects) = (h.idem.clone(), effects.clone());
            async move {
                idem.operation(NAMESPACE, "at-budget")
                    .steps()
                    .run(|cx| async move {
                        let (steps, ()) = cx.into_parts();
                        let big = steps
                            .run("big", || async {
                                effects.happened("big");
                                Ok::<_, AppError>(noise(len, 1))
                            })
                            .await?;
                        if let Some(reserved) = reserved {
                            reserved.notify_one();
                        }
                        steps
                            .run("after", || async {
                                if hang {
                                    std::future::pending::<()>().await;
                                }
                                Ok::<_, AppError>(big.len())
                            })
                            .await
                    })
                    .await
            }
        };
        let reserved = Arc::new(Notify::new());
        tokio::select! {
            _ = call(true, Some(reserved.clone())) => panic!("the second step hangs"),
            () = reserved.notified() => {}
        }
        h.clock.advance(LEASE * 2);
        assert_eq!(call(false, None).await.unwrap(), len, "{backend:?}");
        assert_eq!(effects.runs("big"), 1, "{backend:?}");
    }
}

/// With its own attribute names, a DynamoDB store sizes a step by the *response* attribute's name;
/// a longer `steps` name (valid: up to 64 KB) makes a step the check accepts too large for the
/// PENDING item. Promised: "a step value that would not fit the 400 KB item is a clear error
/// (`StepTooLarge`) before anything is written"; observed: the store's `ValidationException`.
#[tokio::test]
async fn a_long_steps_attribute_name_is_in_the_budget() {
    let len = longest_step_value().await - 64;
    let mut names = idempotent_runtime::AttributeNames::default();
    names.steps = "finished_steps_".repeat(20);
    let (client, counter) = idempotent_tests::client();
    let store = idempotent_runtime::DynamoDbStore::with_attribute_names(
        client,
        idempotent_tests::unique_table("idem"),
        names,
    );
    store.create_table().await.unwrap();
    let h = Harness::over(Arc::new(store), counter, |b| b.default_lease(LEASE));
    let result = h
        .idem
        .operation(NAMESPACE, "long-name")
        .steps()
        .run(|cx| async move {
            let (steps, ()) = cx.into_parts();
            steps
                .run("big", || async move { Ok::<_, AppError>(noise(len, 1)) })
                .await
                .map(|big| big.len())
        })
        .await;
    match result {
        Ok(_) | Err(AppError::Idempotency(Error::StepTooLarge { .. })) => {}
        Err(other) => panic!("expected the step stored or StepTooLarge, got {other}"),
    }
}
