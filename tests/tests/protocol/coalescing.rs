//! Coalescing: concurrent calls on one key through one handle make the requests of one call. The
//! first (the leader) claims; the others follow it and send nothing: with `wait` they get what the
//! leader stored (or read), without it `InProgress` once the leader's claim holds the key. A leader
//! that ends without a stored result hands over to one follower at a time. Every test counts the
//! store's requests exactly (a counting store on both stores, and the SDK's requests on DynamoDB
//! Local) and how often the body ran.
//!
//! The calls of a storm are polled together (`join_all`): each joins the key's flight on its first
//! poll, before the leader's request is answered, as concurrent requests into one process do.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt as _;
use futures_util::future::join_all;
use idempotent_runtime::store::{
    ClaimOutcome, ClaimRequest, TransactOutcome, Transition, WriteOutcome, Writes,
};
use idempotent_runtime::{Error, Idempotency, Record, Status, Store, StoreError};
use idempotent_tests::{AppError, Backend, Harness, idem_error};

const NAMESPACE: &str = "coalescing::charge";

/// A store that counts the requests sent to the one inside (transactions included), each taking at
/// least `latency`: a round trip over a network. (The memory store answers at once, and DynamoDB Local
/// on loopback can answer within the poll that sent the request: a storm's calls would then run one
/// after the other, each finding the last one's flight over.)
#[derive(Debug)]
struct Counted {
    inner: Arc<dyn Store>,
    requests: AtomicUsize,
    latency: Duration,
}

impl Counted {
    fn count(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    async fn sent(&self) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

#[async_trait::async_trait]
impl Store for Counted {
    async fn claim(&self, request: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.sent().await;
        self.inner.claim(request).await
    }

    async fn transition(&self, transition: &Transition<'_>) -> Result<WriteOutcome, StoreError> {
        self.sent().await;
        self.inner.transition(transition).await
    }

    async fn transact_transition(
        &self,
        transition: &Transition<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.sent().await;
        self.inner.transact_transition(transition, writes).await
    }

    async fn claim_transaction(
        &self,
        request: &ClaimRequest<'_>,
        writes: &Writes,
    ) -> Result<TransactOutcome, StoreError> {
        self.sent().await;
        self.inner.claim_transaction(request, writes).await
    }

    async fn get(&self, key: &str) -> Result<Option<Record>, StoreError> {
        self.sent().await;
        self.inner.get(key).await
    }

    fn response_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.response_budget(key, fingerprint)
    }

    fn steps_budget(&self, key: &str, fingerprint: Option<&str>) -> usize {
        self.inner.steps_budget(key, fingerprint)
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

/// A handle over a counting store on `backend`, with the harness (its clock, its record reader and, on
/// DynamoDB, the SDK's request counter).
struct Setup {
    h: Harness,
    idem: Idempotency,
    store: Arc<Counted>,
}

impl Setup {
    async fn new(backend: Backend) -> Self {
        Self::with(backend, |b| b).await
    }

    async fn with(
        backend: Backend,
        configure: impl FnOnce(idempotent_runtime::Builder) -> idempotent_runtime::Builder,
    ) -> Self {
        let h = Harness::new(backend).await;
        let store = Arc::new(Counted {
            inner: h.store.clone(),
            requests: AtomicUsize::new(0),
            latency: Duration::from_millis(5),
        });
        let idem = configure(
            Idempotency::builder_arc(store.clone())
                .clock(h.clock.clone())
                .coalesce(true),
        )
        .build();
        Self { h, idem, store }
    }

    /// Asserts that exactly `expected` requests reached the store since the start (and, on DynamoDB
    /// Local, that the SDK sent as many).
    #[track_caller]
    fn requests(&self, expected: usize, what: &str) {
        assert_eq!(self.store.count(), expected, "store requests: {what}");
        if self.h.dynamodb.is_some() {
            assert_eq!(
                self.h.requests.total(),
                expected,
                "DynamoDB requests: {what}"
            );
        }
    }
}

/// A call of `key` through `idem`, waiting up to `wait`, whose body counts its run, takes a moment
/// (so that the whole storm joins before it ends) and returns which run it was.
async fn charge(
    idem: &Idempotency,
    runs: &AtomicUsize,
    key: &str,
    wait: Duration,
) -> Result<usize, AppError> {
    idem.operation(NAMESPACE, key)
        .wait(wait)
        .run(|_| async {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, AppError>(run)
        })
        .await
}

async fn storm(backend: Backend, calls: usize, wait: Duration) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let results = join_all((0..calls).map(|_| charge(&s.idem, &runs, "o-1", wait))).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
    let mut results = results.into_iter();
    assert_eq!(results.next().unwrap().unwrap(), 1, "the leader's own run");
    for result in results {
        if wait.is_zero() {
            assert!(
                matches!(idem_error(result), Error::InProgress { .. }),
                "a follower without wait gets InProgress"
            );
        } else {
            assert_eq!(result.unwrap(), 1, "a follower gets the stored value");
        }
    }
    s.requests(
        2,
        "the leader's claim and completion; followers send nothing",
    );
    let record = s.h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 1));
}

async fn a_storm_of_20_without_wait_costs_one_call(backend: Backend) {
    storm(backend, 20, Duration::ZERO).await;
}

async fn a_storm_of_100_without_wait_costs_one_call(backend: Backend) {
    storm(backend, 100, Duration::ZERO).await;
}

async fn a_storm_of_20_with_wait_costs_one_call(backend: Backend) {
    storm(backend, 20, Duration::from_secs(10)).await;
}

async fn a_storm_of_100_with_wait_costs_one_call(backend: Backend) {
    storm(backend, 100, Duration::from_secs(10)).await;
}

/// A storm on a key already COMPLETED (no local cache): the leader's refused claim reads the record,
/// and every follower, with or without `wait`, gets the stored value from it.
async fn a_storm_on_a_completed_key_costs_one_request(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    assert_eq!(
        charge(&s.idem, &runs, "o-1", Duration::ZERO).await.unwrap(),
        1
    );
    s.requests(2, "the first call");
    let results = join_all((0..20).map(|i| {
        let wait = if i % 2 == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(10)
        };
        charge(&s.idem, &runs, "o-1", wait)
    }))
    .await;
    for result in results {
        assert_eq!(result.unwrap(), 1);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    s.requests(3, "one refused claim for the whole storm");
}

/// The leader's body fails: its record is FAILED, one follower takes the lead and claims (its body
/// runs), the others follow it and get its stored value.
async fn a_failed_leader_hands_over_to_exactly_one_follower(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let call = |idem: Idempotency| {
        let runs = &runs;
        async move {
            idem.operation(NAMESPACE, "o-1")
                .wait(Duration::from_secs(10))
                .run(|_| async {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    if run == 1 {
                        return Err(AppError::Declined);
                    }
                    Ok(run)
                })
                .await
        }
    };
    let results = join_all((0..10).map(|_| call(s.idem.clone()))).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the leader's run, then one follower's"
    );
    let mut results = results.into_iter();
    assert!(matches!(results.next().unwrap(), Err(AppError::Declined)));
    for result in results {
        assert_eq!(result.unwrap(), 2, "the new leader's stored value");
    }
    s.requests(4, "claim + fail, then one claim + complete");
    let record = s.h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

/// The leader's body panics: the failure is recorded, the panic goes to its caller, and one follower
/// takes the lead.
async fn a_panicking_leader_hands_over_to_exactly_one_follower(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let call = |idem: Idempotency| {
        let runs = &runs;
        let run = async move {
            idem.operation(NAMESPACE, "o-1")
                .wait(Duration::from_secs(10))
                .run(|_| async {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    assert!(run != 1, "the first run panics");
                    Ok::<_, AppError>(run)
                })
                .await
        };
        AssertUnwindSafe(run).catch_unwind()
    };
    let results = join_all((0..10).map(|_| call(s.idem.clone()))).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let mut results = results.into_iter();
    assert!(
        results.next().unwrap().is_err(),
        "the leader's caller gets the panic"
    );
    for result in results {
        assert_eq!(result.expect("no panic").unwrap(), 2);
    }
    s.requests(4, "claim + fail (panicked), then one claim + complete");
}

/// The leader's future is dropped while its body runs (a client hung up): its claim stays PENDING until
/// its lease (the body may have had effects), the flight goes to one follower, which waits on the store
/// as a duplicate does, takes the lapsed claim over, and runs; the others get its value.
async fn a_dropped_leader_hands_over_to_exactly_one_follower(backend: Backend) {
    let s = Setup::with(backend, |b| b.heartbeat(false)).await;
    let runs = AtomicUsize::new(0);
    let clock = s.h.clock.clone();
    let leader = tokio::time::timeout(
        Duration::from_millis(200),
        s.idem.operation(NAMESPACE, "o-1").run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            Ok::<_, AppError>(0)
        }),
    );
    let followers =
        join_all((0..10).map(|_| charge(&s.idem, &runs, "o-1", Duration::from_secs(30))));
    // Once the leader is gone, the claim it left lapses (60 s lease, 1 s margin).
    let lapse = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        clock.advance(Duration::from_secs(62));
    };
    let (leader, followers, ()) = tokio::join!(leader, followers, lapse);
    assert!(leader.is_err(), "the leader was dropped by its timeout");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the dropped body, then one follower's"
    );
    for result in followers {
        assert_eq!(result.unwrap(), 2, "the new leader's stored value");
    }
    let record = s.h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

/// A detached leader whose caller is dropped: its body goes on on its own task, which leads the flight
/// from then on; the followers get its stored value, and nothing runs twice.
async fn a_detached_leader_keeps_its_flight_when_its_caller_leaves(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(tokio::sync::Notify::new());
    let call = {
        let (runs, started) = (runs.clone(), started.clone());
        s.idem
            .operation(NAMESPACE, "o-1")
            .detach()
            .run(move |_| async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, AppError>(runs.fetch_add(1, Ordering::SeqCst) + 1)
            })
    };
    // The caller leaves once the body has started.
    let leader = async {
        tokio::select! {
            result = call => Some(result),
            () = started.notified() => None,
        }
    };
    let followers =
        join_all((0..10).map(|_| charge(&s.idem, &runs, "o-1", Duration::from_secs(10))));
    let (leader, followers) = tokio::join!(leader, followers);
    assert!(leader.is_none(), "the caller left before the body ended");
    for result in followers {
        assert_eq!(result.unwrap(), 1, "the detached body's stored value");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    s.requests(2, "the detached call's claim and completion");
}

/// A call with another payload does not follow: the store answers it, `PayloadMismatch`, while a
/// follower with the leader's payload gets the leader's value.
async fn a_follower_with_another_payload_gets_a_payload_mismatch(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let started = tokio::sync::Notify::new();
    let call = |amount: u64, wait: Duration| {
        let (idem, runs, started) = (&s.idem, &runs, &started);
        async move {
            idem.operation(NAMESPACE, "o-1")
                .payload(&amount)
                .wait(wait)
                .run(|_| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok::<_, AppError>(amount)
                })
                .await
        }
    };
    let wait = Duration::from_secs(10);
    // The other payload's calls come once the leader's claim holds the key.
    let others = async {
        started.notified().await;
        tokio::join!(call(700, Duration::ZERO), call(700, wait))
    };
    let (leader, same, (other, other_waiting)) =
        tokio::join!(call(500, wait), call(500, wait), others);
    assert_eq!(leader.unwrap(), 500);
    assert_eq!(same.unwrap(), 500);
    for other in [other, other_waiting] {
        assert!(
            matches!(idem_error(other), Error::PayloadMismatch { .. }),
            "another payload never gets the leader's value"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    s.requests(
        4,
        "the leader's two, and one refused claim for each other payload",
    );
}

/// A response too large to store: the leader gets its value (it ran), its followers get
/// `ResponseTooLarge`, as a duplicate reading the record does, never the value that was not stored.
async fn followers_of_a_response_too_large_get_response_too_large(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let call = || async {
        s.idem
            .operation(NAMESPACE, "o-1")
            .max_response_bytes(64)
            .wait(Duration::from_secs(10))
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, AppError>("x".repeat(1_000))
            })
            .await
    };
    let results = join_all((0..5).map(|_| call())).await;
    let mut results = results.into_iter();
    assert_eq!(
        results.next().unwrap().unwrap().len(),
        1_000,
        "the leader's own value"
    );
    for result in results {
        assert!(matches!(idem_error(result), Error::ResponseTooLarge { .. }));
    }
    s.requests(2, "the leader's claim and completion");
    // A duplicate now reads the record and gets the same.
    assert!(matches!(
        idem_error(call().await),
        Error::ResponseTooLarge { .. }
    ));
    s.requests(3, "the duplicate's refused claim");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A value that does not serialize: the success is final (COMPLETED with the reason), the leader hears
/// the serialization error, its followers `ResponseNotSerialized`, as duplicates do.
async fn followers_of_a_value_that_does_not_serialize_get_response_not_serialized(
    backend: Backend,
) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let call = || async {
        s.idem
            .operation(NAMESPACE, "o-1")
            .wait(Duration::from_secs(10))
            .run(|_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok::<_, AppError>(f64::NAN)
            })
            .await
    };
    let results = join_all((0..5).map(|_| call())).await;
    let mut results = results.into_iter();
    assert!(matches!(
        idem_error(results.next().unwrap()),
        Error::Serialize { .. }
    ));
    for result in results {
        assert!(matches!(
            idem_error(result),
            Error::ResponseNotSerialized { .. }
        ));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    s.requests(2, "the leader's claim and completion");
    let record = s.h.record(NAMESPACE, "o-1").await.unwrap();
    assert_eq!(record.status, Status::Completed);
}

/// A follower whose wait runs out returns `InProgress`, as a duplicate whose wait runs out does,
/// having sent nothing.
async fn a_follower_whose_wait_runs_out_gets_in_progress(backend: Backend) {
    let s = Setup::new(backend).await;
    let runs = AtomicUsize::new(0);
    let slow = s.idem.operation(NAMESPACE, "o-1").run(|_| async {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        Ok::<_, AppError>(1)
    });
    let (leader, follower) = tokio::join!(
        slow,
        charge(&s.idem, &runs, "o-1", Duration::from_millis(300))
    );
    assert_eq!(leader.unwrap(), 1);
    let Error::InProgress { retry_after, .. } = idem_error(follower) else {
        panic!("InProgress")
    };
    assert!(
        retry_after > Duration::from_secs(50),
        "the leader's live claim: {retry_after:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    s.requests(2, "the leader's claim and completion");
}

/// Coalescing is per handle, and off when the handle says so: every call then claims for itself.
async fn without_coalescing_every_call_claims(backend: Backend) {
    let s = Setup::with(backend, |b| b.coalesce(false)).await;
    let runs = AtomicUsize::new(0);
    let results = join_all((0..5).map(|_| charge(&s.idem, &runs, "o-1", Duration::ZERO))).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    for result in results {
        match result {
            Ok(run) => assert_eq!(run, 1, "the run, or its replay"),
            Err(e) => assert!(matches!(e.idempotency(), Error::InProgress { .. })),
        }
    }
    s.requests(6, "five claims and one completion");
}

idempotent_tests::on_both_stores!(
    a_storm_of_20_without_wait_costs_one_call,
    a_storm_of_100_without_wait_costs_one_call,
    a_storm_of_20_with_wait_costs_one_call,
    a_storm_of_100_with_wait_costs_one_call,
    a_storm_on_a_completed_key_costs_one_request,
    a_failed_leader_hands_over_to_exactly_one_follower,
    a_panicking_leader_hands_over_to_exactly_one_follower,
    a_dropped_leader_hands_over_to_exactly_one_follower,
    a_detached_leader_keeps_its_flight_when_its_caller_leaves,
    a_follower_with_another_payload_gets_a_payload_mismatch,
    followers_of_a_response_too_large_get_response_too_large,
    followers_of_a_value_that_does_not_serialize_get_response_not_serialized,
    a_follower_whose_wait_runs_out_gets_in_progress,
    without_coalescing_every_call_claims,
);
