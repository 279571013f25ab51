//! Behaviour through `#[idempotent]`, on both stores: how many times the body ran, what came back, what
//! the record holds, and (on DynamoDB Local) how many requests were sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{Backend, Harness};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order: String,
    amount: u64,
    run: usize,
}

#[derive(Debug)]
enum PaymentError {
    Declined(String),
    Idempotency(Error),
}

impl From<Error> for PaymentError {
    fn from(e: Error) -> Self {
        PaymentError::Idempotency(e)
    }
}

impl std::fmt::Display for PaymentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PaymentError::Declined(why) => write!(f, "declined: {why}"),
            PaymentError::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// What the body does, and what it saw.
#[derive(Debug, Default)]
struct Control {
    runs: AtomicUsize,
    fail_next: AtomicBool,
    /// Set: the body signals `started` and waits for a permit on `release`.
    hold: Option<(Notify, Semaphore)>,
}

impl Control {
    fn holding() -> Arc<Self> {
        Arc::new(Self {
            hold: Some((Notify::new(), Semaphore::new(0))),
            ..Self::default()
        })
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    fn release(&self) {
        self.hold.as_ref().unwrap().1.add_permits(1);
    }

    async fn started(&self) {
        self.hold.as_ref().unwrap().0.notified().await;
    }
}

const NAMESPACE: &str = "behaviour::charge";

#[idempotent(key = order, store = idem, name = "behaviour::charge", ttl = "1h", lease = "30s")]
async fn charge(
    idem: &Idempotency,
    ctl: &Control,
    order: &str,
    amount: u64,
) -> Result<Receipt, PaymentError> {
    let run = ctl.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some((started, release)) = &ctl.hold {
        started.notify_one();
        release.acquire().await.unwrap().forget();
    }
    if ctl.fail_next.swap(false, Ordering::SeqCst) {
        return Err(PaymentError::Declined(format!("card refused on run {run}")));
    }
    Ok(Receipt {
        order: order.to_owned(),
        amount,
        run,
    })
}

async fn harness(backend: Backend) -> Harness {
    Harness::new(backend).await
}

async fn the_body_runs_once_and_a_duplicate_gets_an_identical_value(backend: Backend) {
    let h = harness(backend).await;
    let ctl = Control::default();
    let first = charge(&h.idem, &ctl, "o-1", 500).await.unwrap();
    let second = charge(&h.idem, &ctl, "o-1", 500).await.unwrap();
    assert_eq!(ctl.runs(), 1);
    assert_eq!(first, second);
    assert_eq!(
        first,
        Receipt {
            order: "o-1".into(),
            amount: 500,
            run: 1
        }
    );
    let record = h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.attempt, 1);
    assert_eq!(
        serde_json::from_slice::<Receipt>(record.response.as_deref().unwrap()).unwrap(),
        first
    );
    // Another key runs the body again.
    charge(&h.idem, &ctl, "o-2", 500).await.unwrap();
    assert_eq!(ctl.runs(), 2);
}

async fn an_error_moves_the_record_to_failed_and_a_retry_runs_again(backend: Backend) {
    let h = harness(backend).await;
    let ctl = Control::default();
    ctl.fail_next.store(true, Ordering::SeqCst);
    let err = charge(&h.idem, &ctl, "o-1", 500).await.unwrap_err();
    assert!(
        matches!(&err, PaymentError::Declined(why) if why == "card refused on run 1"),
        "{err:?}"
    );
    let record = h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.error.as_deref(),
        Some("declined: card refused on run 1")
    );
    let retry = charge(&h.idem, &ctl, "o-1", 500).await.unwrap();
    assert_eq!((ctl.runs(), retry.run), (2, 2));
    let record = h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
    assert_eq!(record.error, None);
}

async fn a_duplicate_while_pending_gets_in_progress(backend: Backend) {
    // No heartbeat: the lease stays the claim's (a beat that renews it while this test
    // waits on a slow DynamoDB Local would move the time the answer counts from).
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    let ctl = Control::holding();
    let first = tokio::spawn({
        let (idem, ctl) = (h.idem.clone(), ctl.clone());
        async move { charge(&idem, &ctl, "o-1", 500).await }
    });
    ctl.started().await;
    h.clock.advance(Duration::from_secs(10));
    let err = charge(&h.idem, &ctl, "o-1", 500).await.unwrap_err();
    let PaymentError::Idempotency(Error::InProgress {
        namespace,
        retry_after,
        retry_hint,
        ..
    }) = err
    else {
        panic!("expected InProgress, got {err:?}")
    };
    assert_eq!(namespace, NAMESPACE);
    assert_eq!(
        retry_after,
        Duration::from_secs(21),
        "30s lease, 10s in, and the 1s clock-skew margin before a takeover"
    );
    assert_eq!(retry_hint, Duration::from_secs(1), "the default hint");
    ctl.release();
    let value = first.await.unwrap().unwrap();
    assert_eq!((ctl.runs(), value.run), (1, 1));
    assert_eq!(charge(&h.idem, &ctl, "o-1", 500).await.unwrap(), value);
}

async fn an_expired_record_runs_again(backend: Backend) {
    let h = harness(backend).await;
    let ctl = Control::default();
    charge(&h.idem, &ctl, "o-1", 500).await.unwrap();
    h.clock.advance(Duration::from_secs(3599));
    assert_eq!(
        charge(&h.idem, &ctl, "o-1", 500).await.unwrap().run,
        1,
        "still within ttl"
    );
    // Expiry has one-second granularity (`expires_at` is in epoch seconds, rounded up so a
    // record never expires early): two seconds past the ttl it is gone.
    // Past the ttl by more than the 1 s clock-skew margin.
    h.clock.advance(Duration::from_secs(4));
    let again = charge(&h.idem, &ctl, "o-1", 500).await.unwrap();
    assert_eq!((ctl.runs(), again.run), (2, 2));
    assert_eq!(h.record(NAMESPACE, "o-1").await.unwrap().attempt, 2);
}

async fn a_taken_over_claim_cannot_store_its_late_result(backend: Backend) {
    let h = Harness::with(backend, |b| b.heartbeat(false)).await;
    let slow = Control::holding();
    let first = tokio::spawn({
        let (idem, slow) = (h.idem.clone(), slow.clone());
        async move { charge(&idem, &slow, "o-1", 500).await }
    });
    slow.started().await;
    // The first worker looks dead: its lease runs out and a second caller takes over.
    // Past the 30 s lease by more than the 1 s clock-skew margin.
    h.clock.advance(Duration::from_secs(32));
    let fast = Control::default();
    // Another process takes over: in the first one's, a duplicate would wait on it.
    let other = h.another_process(|b| b.heartbeat(false));
    let second = charge(&other, &fast, "o-1", 500).await.unwrap();
    assert_eq!(second.run, 1);
    slow.release();
    let late = first.await.unwrap().unwrap_err();
    assert!(
        matches!(&late, PaymentError::Idempotency(Error::LeaseLost { namespace, .. }) if namespace == NAMESPACE),
        "{late:?}"
    );
    // The new owner's result stands, and is what duplicates get.
    let record = h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
    assert_eq!(charge(&h.idem, &fast, "o-1", 500).await.unwrap(), second);
    assert_eq!((slow.runs(), fast.runs()), (1, 1));
}

async fn thirty_two_concurrent_callers_run_the_body_once(backend: Backend) {
    let h = harness(backend).await;
    for round in 0..3 {
        let ctl = Arc::new(Control::default());
        let order = format!("race-{round}");
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let (idem, ctl, order) = (h.idem.clone(), ctl.clone(), order.clone());
                tokio::spawn(async move { charge(&idem, &ctl, &order, 1).await })
            })
            .collect();
        let mut values = Vec::new();
        let mut in_progress = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(v) => values.push(v),
                Err(PaymentError::Idempotency(Error::InProgress { .. })) => in_progress += 1,
                Err(e) => panic!("unexpected {e:?}"),
            }
        }
        assert_eq!(ctl.runs(), 1, "round {round}");
        assert_eq!(values.len() + in_progress, 32);
        assert!(values.iter().all(|v| v.run == 1 && v.order == order));
    }
}

async fn a_long_body_keeps_its_claim_by_heartbeat(backend: Backend) {
    // A 1 s lease (the shortest allowed) and a body of about three: without heartbeats the
    // claim would lapse twice over.
    let h = harness(backend).await;
    let slow = Control::holding();
    let first = tokio::spawn({
        let (idem, slow) = (h.idem.clone(), slow.clone());
        async move { short_lease(&idem, &slow, "o-1").await }
    });
    slow.started().await;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(600)).await;
        h.clock.advance(Duration::from_millis(600));
        let err = short_lease(&h.idem, &Control::default(), "o-1")
            .await
            .unwrap_err();
        assert!(
            matches!(err, PaymentError::Idempotency(Error::InProgress { .. })),
            "{err:?}"
        );
    }
    slow.release();
    assert_eq!(first.await.unwrap().unwrap().run, 1);
    assert_eq!(slow.runs(), 1);
}

#[idempotent(key = order, store = idem, name = "behaviour::short", lease = "1s")]
async fn short_lease(
    idem: &Idempotency,
    ctl: &Control,
    order: &str,
) -> Result<Receipt, PaymentError> {
    charge_body(ctl, order).await
}

async fn charge_body(ctl: &Control, order: &str) -> Result<Receipt, PaymentError> {
    let run = ctl.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some((started, release)) = &ctl.hold {
        started.notify_one();
        release.acquire().await.unwrap().forget();
    }
    Ok(Receipt {
        order: order.to_owned(),
        amount: 0,
        run,
    })
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test]
    the_body_runs_once_and_a_duplicate_gets_an_identical_value,
    #[tokio::test]
    an_error_moves_the_record_to_failed_and_a_retry_runs_again,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_duplicate_while_pending_gets_in_progress,
    #[tokio::test]
    an_expired_record_runs_again,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_taken_over_claim_cannot_store_its_late_result,
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    thirty_two_concurrent_callers_run_the_body_once,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_long_body_keeps_its_claim_by_heartbeat,
}
