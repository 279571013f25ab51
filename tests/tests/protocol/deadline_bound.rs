//! Deadline-bound calls (`Operation::deadline`): the lease ends by the deadline, and no body of the
//! key runs twice for it. Each test holds a body open past its call's deadline, lets the claim lapse
//! for another caller (the lease plus the clock-skew margin, on the harness's clock), and counts how
//! often the body ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use idempotent_runtime::{Error, Status};
use idempotent_tests::{AppError, Backend, Gate, Harness, idem_error};

const NAMESPACE: &str = "deadline_bound::charge";

/// The default clock-skew margin, plus a millisecond: how far past a lease's end another caller's
/// clock must be before it takes the claim over.
const PAST_THE_MARGIN: Duration = Duration::from_millis(1_001);

/// Lets `by` pass on the harness's clock as it would in a live process: in steps of half a second,
/// each followed by a little more real time, so that the running body's heartbeats (every third of
/// its lease, timed in real time) are sent as the clock goes.
async fn time_passes(h: &Harness, by: Duration) {
    let step = Duration::from_millis(500);
    let mut passed = Duration::ZERO;
    while passed < by {
        let next = step.min(by.saturating_sub(passed));
        h.clock.advance(next);
        passed += next;
        tokio::time::sleep(next + Duration::from_millis(100)).await;
    }
}

/// A call whose deadline has already passed when it claims: its lease is a millisecond, so it must
/// not start its body (a batch does not even claim then). It does start it, and another caller takes
/// the key over a second later while that body still runs: the body runs twice.
async fn a_call_past_its_deadline_does_not_start_its_body(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let gate = Gate::default();
    let past = SystemTime::now() - Duration::from_secs(1);
    let late = h
        .idem
        .operation(NAMESPACE, "order-1")
        .deadline(past)
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            gate.enter().await
        });
    let other = h.another_process(|b| b);
    let takeover = async {
        // The late call's body, if it starts at all, is running from here on.
        let started = tokio::time::timeout(Duration::from_secs(2), gate.started())
            .await
            .is_ok();
        // Its lease is the millisecond the deadline left it.
        h.clock.advance(Duration::from_millis(1) + PAST_THE_MARGIN);
        let taken = other
            .operation(NAMESPACE, "order-1")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(100)
            })
            .await;
        gate.release();
        (started, taken)
    };
    let (late, (started, taken)) = tokio::join!(late, takeover);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a body started after its call's deadline (started: {started}) ran beside the taker's \
         (late call: {late:?}, taker: {taken:?})"
    );
}

/// A detached body outlives its caller by design, so a deadline-bound call whose caller gave up may
/// keep running past the deadline. Its heartbeats renew its claim past the deadline too: another
/// caller finds the key in progress, and the body runs once.
async fn a_detached_body_past_its_deadline_keeps_its_claim(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Gate::default());
    let deadline = SystemTime::now() + Duration::from_secs(3);
    let call = {
        let (runs, gate) = (runs.clone(), gate.clone());
        h.idem
            .operation(NAMESPACE, "order-1")
            .deadline(deadline)
            .detach()
            .run(move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                gate.enter().await
            })
    };
    // The caller gives up once the body has started (a Lambda handler answering before its deadline);
    // the body runs on.
    let caller = async {
        tokio::select! {
            result = call => Some(result),
            () = gate.started() => None,
        }
    };
    assert!(caller.await.is_none(), "the caller left while the body ran");
    // Past the deadline, and the margin after it: the first body still runs.
    time_passes(&h, Duration::from_secs(3) + PAST_THE_MARGIN).await;
    let taken = h
        .another_process(|b| b)
        .operation(NAMESPACE, "order-1")
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AppError>(100)
        })
        .await;
    gate.release();
    assert_eq!(h.idem.drain(Duration::from_secs(5)).await, 0);
    let record = h.record(NAMESPACE, "order-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert!(
        matches!(taken, Err(AppError::Idempotency(Error::InProgress { .. }))),
        "{taken:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the detached body ran past its deadline beside the taker's (taker: {taken:?})"
    );
}

/// The same with the body in place, its caller still waiting: its heartbeats keep its claim past the
/// deadline, another caller finds the key in progress, and the first body's value is stored.
async fn a_body_running_past_its_deadline_keeps_its_claim(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let gate = Gate::default();
    let deadline = SystemTime::now() + Duration::from_secs(3);
    let first = h
        .idem
        .operation(NAMESPACE, "order-1")
        .deadline(deadline)
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            gate.enter().await
        });
    let other = h.another_process(|b| b);
    let takeover = async {
        gate.started().await;
        time_passes(&h, Duration::from_secs(3) + PAST_THE_MARGIN).await;
        let taken = other
            .operation(NAMESPACE, "order-1")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(100)
            })
            .await;
        gate.release();
        taken
    };
    let (first, taken) = tokio::join!(first, takeover);
    assert!(
        matches!(idem_error(taken), Error::InProgress { .. }),
        "the running body's claim is live"
    );
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the first body ran past its deadline beside the taker's"
    );
}

/// A call bound by a deadline that waits (`wait`) on a key another process holds goes on waiting
/// past its deadline; when the holder fails, it claims the key with a 1 ms lease and starts its body
/// after its deadline. A caller a second later takes the key over while that body still runs: after
/// the one failure, two bodies run.
async fn a_call_that_waited_past_its_deadline_does_not_start_its_body(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let (held, late) = (Gate::default(), Gate::default());
    let go = tokio::sync::Notify::new();
    held.fail_next();
    let (holder_idem, third_idem) = (h.another_process(|b| b), h.another_process(|b| b));
    let holder = holder_idem.operation(NAMESPACE, "order-1").run(|_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        held.enter().await
    });
    let waiter = async {
        go.notified().await;
        h.idem
            .operation(NAMESPACE, "order-1")
            .deadline(SystemTime::now() + Duration::from_secs(2))
            .wait(Duration::from_secs(30))
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                late.enter().await
            })
            .await
    };
    let driver = async {
        held.started().await;
        go.notify_one();
        // The waiter finds the key held and polls it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Its deadline passes, then the holder's body fails.
        h.clock.advance(Duration::from_millis(2_500));
        held.release();
        let started = tokio::time::timeout(Duration::from_secs(3), late.started())
            .await
            .is_ok();
        h.clock.advance(Duration::from_millis(1) + PAST_THE_MARGIN);
        let taken = third_idem
            .operation(NAMESPACE, "order-1")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(100)
            })
            .await;
        late.release();
        (started, taken)
    };
    let (holder, waiter, (started, taken)) = tokio::join!(holder, waiter, driver);
    assert!(matches!(holder, Err(AppError::Declined)));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the holder's failed run, then one more (the waiter started after its deadline: \
         {started}; waiter: {waiter:?}, taker: {taken:?})"
    );
}

/// A lease under the floor (`MIN_LEASE`) is refused, because it cannot be renewed, unless the call
/// is bound by a deadline; but the check is skipped for any deadline, also one far beyond the lease.
/// Such a lease ends long before the deadline, heartbeats (on) never renew it, and another caller
/// takes the key over while the body runs.
async fn a_short_lease_beside_a_far_deadline_is_not_taken_over(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    let gate = Gate::default();
    let first = h
        .idem
        .operation(NAMESPACE, "order-1")
        .deadline(SystemTime::now() + Duration::from_hours(1))
        .lease(Duration::from_millis(300))
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            gate.enter().await
        });
    let other = h.another_process(|b| b);
    let takeover = async {
        let started = tokio::time::timeout(Duration::from_secs(2), gate.started())
            .await
            .is_ok();
        h.clock
            .advance(Duration::from_millis(300) + PAST_THE_MARGIN);
        let taken = other
            .operation(NAMESPACE, "order-1")
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, AppError>(100)
            })
            .await;
        gate.release();
        (started, taken)
    };
    let (first, (started, taken)) = tokio::join!(first, takeover);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a 300 ms lease with an hour's deadline (started: {started}) was taken over while its body ran \
         (first: {first:?}, taker: {taken:?})"
    );
}

idempotent_tests::on_both_stores!(
    a_call_past_its_deadline_does_not_start_its_body,
    a_detached_body_past_its_deadline_keeps_its_claim,
    a_body_running_past_its_deadline_keeps_its_claim,
    a_call_that_waited_past_its_deadline_does_not_start_its_body,
    a_short_lease_beside_a_far_deadline_is_not_taken_over,
);
