//! Interruptions, on both stores: a caller's future dropped before the body started (its claim is
//! released at once), dropped while the body runs (the key stays PENDING until its lease), a detached
//! call whose caller gave up (the body runs to its end and its result is stored), a panicking body (the
//! record is FAILED, the panic reaches the caller), and a shutdown that waits for detached bodies
//! (`Idempotency::drain`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::store::{ClaimOutcome, ClaimRequest};
use idempotent_runtime::{Error, Idempotency, Record, Status, Store, StoreError, idempotent};
use idempotent_tests::proxy::{Fault, Rule};
use idempotent_tests::{AppError, Backend, Forward, Harness, RequestCounter, idem_error};
use tokio::sync::{Notify, Semaphore};

const NAMESPACE: &str = "interruptions::charge";

/// The namespace of `dropped_calls_are_counted_by_phase`'s calls, which no other test uses.
const COUNTED: &str = "interruptions::counted";

/// A store whose claims land at once but whose answers come `delay` late: a caller that gives up in
/// between has a claim it never heard of.
#[derive(Debug)]
struct SlowClaim {
    delay: Duration,
    /// Notified when a claim has been answered by the store (and before its caller hears of it).
    landed: Arc<Notify>,
}

impl SlowClaim {
    fn over(inner: Arc<dyn Store>) -> Arc<Delegating<Forward, Self>> {
        Arc::new(Delegating::new(
            Forward(inner),
            Self {
                delay: Duration::from_secs(30),
                landed: Arc::new(Notify::new()),
            },
        ))
    }
}

#[async_trait::async_trait]
impl Override<Forward> for SlowClaim {
    fn kind(&self) -> &'static str {
        "slow-claim"
    }

    async fn claim(
        &self,
        inner: &Forward,
        request: &ClaimRequest<'_>,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = inner.claim(request).await;
        self.landed.notify_one();
        tokio::time::sleep(self.delay).await;
        outcome
    }
}

/// The record of `key`, once it is no longer PENDING (or after 3 s, as it is then).
async fn settled(h: &Harness, key: &str) -> Option<Record> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let record = h.record(NAMESPACE, key).await;
        if record.as_ref().is_none_or(|r| r.status != Status::Pending)
            || tokio::time::Instant::now() > deadline
        {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A call of `NAMESPACE` with `key` whose body counts its run and returns `value`.
async fn charge(
    idem: &Idempotency,
    key: &str,
    runs: &AtomicUsize,
    value: u32,
) -> Result<u32, AppError> {
    idem.operation(NAMESPACE, key)
        .run(|_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(value)
        })
        .await
}

/// Runs `call` until `signal` is notified, then drops it (as a caller that gives up does).
async fn drop_when<F: std::future::Future>(call: F, signal: &Notify) {
    tokio::select! {
        _ = call => panic!("the call finished before it was to be dropped"),
        () = signal.notified() => {}
    }
}

/// The panic's message, as `panic!` gave it.
fn message(panic: &(dyn std::any::Any + Send)) -> String {
    idempotent_tests::panic_message(panic).expect("a panic with a message")
}

/// A body that panics: its record is FAILED with `panicked: <message>` (so the key is free
/// at once, not blocked for the lease), and the very panic reaches the caller.
#[allow(
    clippy::manual_assert,
    reason = "a `panic!` behind a condition the compiler cannot see through keeps the `Ok` after it reachable"
)]
async fn a_panicking_body_fails_its_record_and_the_panic_goes_on(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let (idem, counted) = (h.idem.clone(), runs.clone());
    let caller = tokio::spawn(async move {
        idem.operation(NAMESPACE, "p-1")
            .run(|_| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                if counted.load(Ordering::SeqCst) > 0 {
                    panic!("card reader on fire");
                }
                Ok::<u32, AppError>(1)
            })
            .await
    });
    let panic = caller.await.expect_err("the caller panics").into_panic();
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"card reader on fire"));
    let record = h.record(NAMESPACE, "p-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.error.as_deref(),
        Some("panicked: card reader on fire")
    );
    // The key is free at once: the retry runs the body.
    assert_eq!(charge(&h.idem, "p-1", &runs, 2).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        h.record(NAMESPACE, "p-1").await.unwrap().status,
        Status::Completed
    );
}

/// A panic's message is cut like any error's text (at most 4 KiB stored).
#[allow(
    clippy::manual_assert,
    reason = "a `panic!` behind a condition the compiler cannot see through keeps the `Ok` after it reachable"
)]
async fn a_long_panic_message_is_cut_like_any_error(backend: Backend) {
    let h = Harness::new(backend).await;
    let idem = h.idem.clone();
    let caller = tokio::spawn(async move {
        idem.operation(NAMESPACE, "p-2")
            .run(|_| async move {
                if NAMESPACE.len() > 1 {
                    panic!("{}", "x".repeat(4_200));
                }
                Ok::<u32, AppError>(1)
            })
            .await
    });
    let panic = caller.await.expect_err("the caller panics").into_panic();
    assert_eq!(
        message(&*panic).len(),
        4_200,
        "the panic itself is unchanged"
    );
    let error = h.record(NAMESPACE, "p-2").await.unwrap().error.unwrap();
    assert!(error.starts_with("panicked: xxx"), "{error}");
    assert!(error.len() <= 4096, "{} bytes", error.len());
    assert!(error.ends_with("(4210 bytes in all)"), "{error}");
}

/// A caller that gives up while its claim is on its way (the claim lands, the answer comes
/// late): the claim is released, and the next caller runs the body at once instead of
/// finding the key PENDING for a whole lease.
async fn a_call_dropped_during_its_claim_leaves_the_key_free(backend: Backend) {
    let base = Harness::new(backend).await;
    let slow = SlowClaim::over(base.store.clone());
    let h = Harness::over(slow.clone(), RequestCounter::default(), |b| b);
    let runs = AtomicUsize::new(0);
    // The claim has landed; its answer is on its way when the caller gives up.
    drop_when(charge(&h.idem, "d-1", &runs, 1), &slow.landed).await;
    let record = settled(&h, "d-1").await.expect("the claim had landed");
    assert_eq!(record.status, Status::Failed, "released");
    assert_eq!(
        record.error.as_deref(),
        Some("released: the call was dropped before its body started")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // The next caller claims the key at once and runs the body.
    assert_eq!(charge(&base.idem, "d-1", &runs, 2).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A caller dropped while its (not detached) body runs: the body stops where it is, and the
/// key stays PENDING until its lease (the body may have had effects): a duplicate gets
/// `InProgress`, not a second run.
async fn a_call_dropped_mid_body_keeps_the_key_pending(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let started = Notify::new();
    let call = h.idem.operation(NAMESPACE, "m-1").run(|_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        started.notify_one();
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<u32, AppError>(1)
    });
    drop_when(call, &started).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(h.idem.drain(Duration::from_secs(5)).await, 0);
    assert_eq!(
        h.record(NAMESPACE, "m-1").await.unwrap().status,
        Status::Pending
    );
    let duplicate = charge(&h.idem, "m-1", &runs, 2).await;
    assert!(matches!(idem_error(duplicate), Error::InProgress { .. }));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A detached call whose caller times out: the body runs to its end on its own task, its
/// result is stored once, a duplicate meanwhile gets `InProgress`, and one after it gets
/// the stored value without a second run.
async fn a_detached_call_outlives_its_callers_timeout(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(Notify::new());
    let (counted, held, starting) = (runs.clone(), gate.clone(), started.clone());
    let call = h
        .idem
        .operation(NAMESPACE, "t-1")
        .detach()
        .run(move |_| async move {
            counted.fetch_add(1, Ordering::SeqCst);
            starting.notify_one();
            held.acquire().await.unwrap().forget();
            Ok::<u32, AppError>(7)
        });
    // The caller's `timeout` runs out once the body has started.
    let call = tokio::time::timeout(Duration::from_secs(30), call);
    drop_when(call, &started).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body started");
    // Still running on its own task: the key is held, not abandoned.
    let duplicate = charge(&h.idem, "t-1", &runs, 8).await;
    assert!(matches!(idem_error(duplicate), Error::InProgress { .. }));
    assert_eq!(
        h.idem.drain(Duration::from_millis(50)).await,
        1,
        "still running"
    );
    gate.add_permits(1);
    assert_eq!(h.idem.drain(Duration::from_secs(10)).await, 0);
    let record = h.record(NAMESPACE, "t-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.as_deref(), Some(&b"7"[..]));
    assert_eq!(
        charge(&h.idem, "t-1", &runs, 8).await.unwrap(),
        7,
        "replayed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A detached call awaited to its end behaves as any call: its value, then replays.
async fn a_detached_call_returns_its_value_and_replays(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let detached = |value: u32| {
        let counted = runs.clone();
        h.idem
            .operation(NAMESPACE, "t-2")
            .detach()
            .run(move |_| async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, AppError>(value)
            })
    };
    let (first, execution) = idempotent_runtime::observe(detached(1)).await;
    assert_eq!(
        (first.unwrap(), execution),
        (1, Some(idempotent_runtime::Execution::Executed))
    );
    let (again, execution) = idempotent_runtime::observe(detached(2)).await;
    assert_eq!(
        (again.unwrap(), execution),
        (1, Some(idempotent_runtime::Execution::Replayed))
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A detached body that panics: FAILED with its message, and its panic reaches the caller
/// (from the body's task) as it was.
#[allow(
    clippy::manual_assert,
    clippy::erasing_op,
    reason = "a `panic!` behind a value the compiler cannot see is constant keeps the `Ok` after it reachable"
)]
async fn a_detached_panic_fails_the_record_and_reaches_the_caller(backend: Backend) {
    let h = Harness::new(backend).await;
    let idem = h.idem.clone();
    let caller = tokio::spawn(async move {
        idem.operation(NAMESPACE, "t-3")
            .detach()
            .run(|_| async move {
                let status = NAMESPACE.len() * 0 + 502;
                if status > 0 {
                    panic!("gateway said {status}");
                }
                Ok::<u32, AppError>(1)
            })
            .await
    });
    let panic = caller.await.expect_err("the caller panics").into_panic();
    // The body's own payload: a `String`, since its message was formatted.
    assert_eq!(
        panic.downcast_ref::<String>().map(String::as_str),
        Some("gateway said 502")
    );
    let record = h.record(NAMESPACE, "t-3").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(record.error.as_deref(), Some("panicked: gateway said 502"));
}

/// `#[idempotent(.., detach)]`: the caller's timeout does not stop the body.
async fn the_attributes_detach_outlives_the_callers_timeout(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let started = Arc::new(Notify::new());
    let call = ship(
        h.idem.clone(),
        "s-1".into(),
        runs.clone(),
        gate.clone(),
        started.clone(),
    );
    drop_when(call, &started).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    gate.add_permits(1);
    assert_eq!(h.idem.drain(Duration::from_secs(10)).await, 0);
    let again = ship(
        h.idem.clone(),
        "s-1".into(),
        runs.clone(),
        gate.clone(),
        started,
    );
    assert_eq!(again.await.unwrap(), "shipped s-1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[idempotent(key = order, store = idem, name = "interruptions::ship", detach)]
async fn ship(
    idem: Idempotency,
    order: String,
    runs: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
    started: Arc<Notify>,
) -> Result<String, Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    started.notify_one();
    gate.acquire().await.unwrap().forget();
    Ok(format!("shipped {order}"))
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    a_panicking_body_fails_its_record_and_the_panic_goes_on,
    #[tokio::test]
    a_long_panic_message_is_cut_like_any_error,
    #[tokio::test]
    a_call_dropped_during_its_claim_leaves_the_key_free,
    #[tokio::test]
    a_call_dropped_mid_body_keeps_the_key_pending,
    #[tokio::test]
    a_detached_call_outlives_its_callers_timeout,
    #[tokio::test]
    a_detached_call_returns_its_value_and_replays,
    #[tokio::test]
    a_detached_panic_fails_the_record_and_reaches_the_caller,
    #[tokio::test]
    the_attributes_detach_outlives_the_callers_timeout,
}

/// On DynamoDB Local, behind the fault proxy: the claim's request is held back, the caller gives up
/// (its connection closes before the request is forwarded), and the release that follows finds
/// nothing to release. The key is free: the next caller runs the body.
#[tokio::test]
async fn a_call_dropped_while_its_claim_is_delayed_leaves_the_key_free() {
    let (h, proxy) = Harness::behind_proxy(|b| b).await;
    proxy.set_rules([Rule::new(Fault::Delay(Duration::from_millis(500)))
        .operation("UpdateItem")
        .first(1)]);
    let runs = AtomicUsize::new(0);
    let gave_up =
        tokio::time::timeout(Duration::from_millis(100), charge(&h.idem, "x-1", &runs, 1)).await;
    assert!(gave_up.is_err(), "the caller gave up during the claim");
    assert_eq!(h.idem.drain(Duration::from_secs(5)).await, 0);
    // Past the delay: a claim still on its way would have landed by now.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(proxy.stats().operation("UpdateItem").delayed, 1);
    let record = h.record(NAMESPACE, "x-1").await;
    assert!(
        record.as_ref().is_none_or(|r| r.status != Status::Pending),
        "{record:?}"
    );
    assert_eq!(charge(&h.idem, "x-1", &runs, 2).await.unwrap(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `idempotency_calls_dropped_total{phase}` counts both kinds of drop (memory store; the only test of
/// this binary with a metrics recorder). Its calls have a namespace of their own: the recorder is
/// global, and the tests running beside it drop calls of `NAMESPACE`.
#[tokio::test]
async fn dropped_calls_are_counted_by_phase() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this test binary");
    let base = Harness::new(Backend::Memory).await;
    let slow = SlowClaim::over(base.store.clone());
    let h = Harness::over(slow.clone(), RequestCounter::default(), |b| b);
    let claim = h
        .idem
        .operation(COUNTED, "c-1")
        .run(|_| async { Ok::<u32, AppError>(1) });
    drop_when(claim, &slow.landed).await;
    let started = Notify::new();
    let body = base.idem.operation(COUNTED, "c-2").run(|_| async {
        started.notify_one();
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok::<u32, AppError>(1)
    });
    drop_when(body, &started).await;
    // A call dropped while it waits for another's claim has nothing to release, and is not counted.
    let waiting = base
        .idem
        .operation(COUNTED, "c-2")
        .wait(Duration::from_secs(30))
        .run(|_| async { Ok::<u32, AppError>(3) });
    assert!(
        tokio::time::timeout(Duration::from_millis(100), waiting)
            .await
            .is_err()
    );
    let snapshot = snapshotter.snapshot().into_vec();
    let counted = |phase: &str| {
        snapshot
            .iter()
            .filter(|(key, _, _, _)| {
                key.key().name() == "idempotency_calls_dropped_total"
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "phase" && l.value() == phase)
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "namespace" && l.value() == COUNTED)
            })
            .map(|(_, _, _, value)| match value {
                DebugValue::Counter(n) => *n,
                other => panic!("{other:?}"),
            })
            .sum::<u64>()
    };
    assert_eq!(counted("claim"), 1);
    assert_eq!(counted("body"), 1);
}
