//! A claim that takes a key over keeps the record's released tokens and their end (`#rl`, `#rd`:
//! "What each transition keeps"), but gives the record its own expiry, counted from its own lease
//! and `ttl`. Heartbeats, completions and failures never give a record an expiry earlier than its
//! released tokens' end (`Record::outlives_released`); a claim does, when its lease ends before the
//! released claim's by more than its `ttl`: a call bound by a deadline, or a claim sent before the
//! call that gave up sent its own and landing after that call's release. Once such a record expires
//! (TTL deletes it, or a release replaces it with its own mark) the released claim can land, and
//! holds the key with no body running.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use idempotent_runtime::aws_sdk_dynamodb::types::AttributeValue;
use idempotent_runtime::store::conformance::Delegating;
use idempotent_runtime::{
    Clock, DynamoDbStore, Error, Idempotency, ManualClock, MemoryStore, Record, Status, Store,
};
use idempotent_tests::{Backend, ClaimAppliedLate, Forward, Runs, dynamodb_store};

const NAMESPACE: &str = "takeover_expiry::charge";
const KEY: &str = "order-1";
const LEASE: Duration = Duration::from_mins(1);
/// Shorter than the lease, as in `given_up_claims`.
const SHORT_TTL: Duration = Duration::from_secs(5);

/// The derived key of [`KEY`].
fn key() -> String {
    idempotent_runtime::derive_key(NAMESPACE, KEY).unwrap()
}

/// The record of [`KEY`].
async fn record(store: &dyn Store) -> Option<Record> {
    store.get(&key()).await.unwrap()
}

/// A store whose expired records can be deleted as DynamoDB's TTL deletes them.
enum Expiring {
    Memory(Arc<MemoryStore>),
    DynamoDb(DynamoDbStore),
}

impl Expiring {
    async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Memory => Self::Memory(Arc::new(MemoryStore::new())),
            Backend::DynamoDb => Self::DynamoDb(dynamodb_store().await.0),
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Memory(memory) => memory.clone(),
            Self::DynamoDb(store) => Arc::new(store.clone()),
        }
    }

    /// Deletes the record of [`KEY`] if it has expired at `now_ms`, as TTL does.
    async fn delete_expired(&self, now_ms: u64) {
        match self {
            Self::Memory(memory) => memory.purge_expired(now_ms),
            Self::DynamoDb(store) => {
                let expired = record(store)
                    .await
                    .is_some_and(|record| record.is_expired(now_ms));
                if expired {
                    store
                        .client()
                        .delete_item()
                        .table_name(store.table())
                        .key("pk", AttributeValue::S(key()))
                        .send()
                        .await
                        .unwrap();
                }
            }
        }
    }
}

/// A body fails on purpose, or the library fails.
#[derive(Debug)]
enum BodyError {
    Failed,
    Idempotency(Error),
}

impl From<Error> for BodyError {
    fn from(e: Error) -> Self {
        Self::Idempotency(e)
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed => f.write_str("the body failed"),
            Self::Idempotency(e) => write!(f, "{e}"),
        }
    }
}

/// The operation on [`KEY`] with a one-minute lease and [`SHORT_TTL`]: counts its runs, returns
/// which run it was.
async fn charge(idem: &Idempotency, runs: &Runs) -> Result<usize, Error> {
    idem.operation(NAMESPACE, KEY)
        .lease(LEASE)
        .ttl(SHORT_TTL)
        .run(|_| async { Ok::<_, Error>(runs.0.fetch_add(1, Ordering::SeqCst) + 1) })
        .await
}

/// A holder's body fails once `go` has a permit; a call on a slow store gives up its claim (which
/// lands 2 s after it was sent) while the holder runs, and leaves its token on the holder's record,
/// held until a lease (and the margin) later. The holder fails: the FAILED record keeps the token
/// and lives until that end. An invocation bound by a three-second deadline (a Lambda's) takes the
/// key over and is killed at its deadline, as its runtime kills it: its claim gives the record an
/// expiry of 3 s + `ttl`, well before the released tokens' end. The record expires, TTL deletes it,
/// and the released claim lands on no record: the key is held for the rest of that claim's minute
/// by a call that gave up, with no body running. A caller right after must run.
async fn a_takeover_by_a_deadline_bound_call_keeps_the_released_tokens_record(backend: Backend) {
    taken_over_by_a_killed_invocation(backend, Then::TtlDeletes).await;
}

/// As [`a_takeover_by_a_deadline_bound_call_keeps_the_released_tokens_record`], without TTL: once
/// the killed invocation's record has expired, a third call on a slow store gives up its own claim,
/// and its release, finding an expired record, writes its mark in its place (`RELEASE`, which
/// replaces the released tokens with its own). The first call's token is gone from the record while
/// its claim is still on the wire: it lands on the mark, which it may claim, and holds the key for
/// the rest of its minute with no body running.
async fn a_release_on_a_record_expired_by_a_takeover_keeps_earlier_tokens(backend: Backend) {
    taken_over_by_a_killed_invocation(backend, Then::AnotherCallGivesUp).await;
}

/// What happens to the record once the killed invocation's claim has expired.
enum Then {
    /// TTL deletes it.
    TtlDeletes,
    /// A third call gives up its claim on a slow store, and its release marks the expired record.
    AnotherCallGivesUp,
}

async fn taken_over_by_a_killed_invocation(backend: Backend, then: Then) {
    let expiring = Expiring::new(backend).await;
    let store = expiring.store();
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .heartbeat(false)
        .build();
    let runs = Runs::default();
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = tokio::spawn({
        let (idem, runs, go) = (direct.clone(), runs.clone(), go.clone());
        async move {
            idem.operation(NAMESPACE, KEY)
                .lease(LEASE)
                .ttl(SHORT_TTL)
                .run(|_| async {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    go.acquire().await.unwrap().forget();
                    Err::<usize, _>(BodyError::Failed)
                })
                .await
        }
    });
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let slow = Idempotency::builder_arc(Arc::new(Delegating::new(
        Forward(store.clone()),
        ClaimAppliedLate(Duration::from_secs(2)),
    )))
    .clock(clock.clone())
    .build();
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    go.add_permits(1);
    assert!(
        matches!(holder.await.unwrap(), Err(BodyError::Failed)),
        "the holder's body failed"
    );
    let failed = record(&*store).await.unwrap();
    assert_eq!(
        (failed.status, failed.released.len()),
        (Status::Failed, 1),
        "the failure keeps the released token: {failed:?}"
    );

    // A Lambda invocation with three seconds left takes the key over and is killed mid-body.
    let invocation = tokio::spawn({
        let (idem, runs) = (direct.clone(), runs.clone());
        async move {
            idem.operation(NAMESPACE, KEY)
                .lease(LEASE)
                .ttl(SHORT_TTL)
                .deadline(SystemTime::now() + Duration::from_secs(3))
                .run(|_| async {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<Result<usize, Error>>().await
                })
                .await
        }
    });
    while runs.count() == 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    invocation.abort();
    assert!(invocation.await.unwrap_err().is_cancelled());
    let taken_over = record(&*store).await.unwrap();

    // Its lease and the record's expiry pass; TTL deletes the record, or another call gives up on
    // it. Then the released claim lands.
    clock.advance(Duration::from_secs(3) + SHORT_TTL + Duration::from_secs(3));
    match then {
        Then::TtlDeletes => expiring.delete_expired(clock.now_ms()).await,
        Then::AnotherCallGivesUp => {
            let slower = Idempotency::builder_arc(Arc::new(Delegating::new(
                Forward(store.clone()),
                ClaimAppliedLate(Duration::from_secs(10)),
            )))
            .clock(clock.clone())
            .build();
            let gave_up =
                tokio::time::timeout(Duration::from_millis(50), charge(&slower, &runs)).await;
            assert!(gave_up.is_err(), "the third caller gave up: {gave_up:?}");
            slower.drain(Duration::from_secs(10)).await;
            let marked = record(&*store).await.unwrap();
            assert!(
                marked.released.len() == 2
                    && failed.released.iter().all(|t| marked.released.contains(t)),
                "the third call's release keeps the earlier token beside its own (the takeover \
                 kept the record alive until that token's end): {marked:?}"
            );
        }
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let landed = record(&*store).await;
    let answer = charge(&direct, &runs).await;
    assert!(
        matches!(answer, Ok(3)),
        "the key is not held by a call that gave up: {answer:?}; record after the takeover: \
         {taken_over:?}; after the released claim landed: {landed:?}"
    );
    assert_eq!(runs.count(), 3);
}

/// Without a deadline, every call with the same one-minute lease: a claim sent before another call
/// gave up, and landing after that call's release marked the record, carries an expiry counted from
/// its own (earlier) send. A holder's body waits; a second call's claim is slow on the wire (2 s).
/// Twenty seconds later a third call gives up its own slow claim (5 s on the wire), and its release
/// leaves its token on the holder's record, held until 81 s. The holder fails; the second call's
/// claim lands on the FAILED record (expiry 65 s, from its send), runs its body, and its worker is
/// killed. The record expires and TTL deletes it; the third call's claim lands on nothing and holds
/// the key until 80 s with no body running.
async fn a_slow_takeover_claim_keeps_the_released_tokens_record(backend: Backend) {
    let expiring = Expiring::new(backend).await;
    let store = expiring.store();
    let clock = ManualClock::starting_now();
    let direct = Idempotency::builder_arc(store.clone())
        .clock(clock.clone())
        .heartbeat(false)
        .build();
    let late = |after: Duration| {
        Idempotency::builder_arc(Arc::new(Delegating::new(
            Forward(store.clone()),
            ClaimAppliedLate(after),
        )))
        .clock(clock.clone())
        .heartbeat(false)
        .build()
    };
    let runs = Runs::default();
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let holder = tokio::spawn({
        let (idem, runs, go) = (direct.clone(), runs.clone(), go.clone());
        async move {
            idem.operation(NAMESPACE, KEY)
                .lease(LEASE)
                .ttl(SHORT_TTL)
                .run(|_| async {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    go.acquire().await.unwrap().forget();
                    Err::<usize, _>(BodyError::Failed)
                })
                .await
        }
    });
    while runs.count() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The second call's claim goes out at 0 s and lands 2 s later (real time).
    let second = tokio::spawn({
        let (idem, runs) = (late(Duration::from_secs(2)), runs.clone());
        async move {
            idem.operation(NAMESPACE, KEY)
                .lease(LEASE)
                .ttl(SHORT_TTL)
                .run(|_| async {
                    runs.0.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<Result<usize, Error>>().await
                })
                .await
        }
    });
    // Let its claim go out before the clock moves.
    tokio::time::sleep(Duration::from_millis(200)).await;
    clock.advance(Duration::from_secs(20));
    let slow = late(Duration::from_secs(5));
    let gave_up = tokio::time::timeout(Duration::from_millis(50), charge(&slow, &runs)).await;
    assert!(gave_up.is_err(), "the third caller gave up: {gave_up:?}");
    slow.drain(Duration::from_secs(10)).await;
    go.add_permits(1);
    assert!(matches!(holder.await.unwrap(), Err(BodyError::Failed)));
    while runs.count() == 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    second.abort();
    assert!(second.await.unwrap_err().is_cancelled());
    let taken_over = record(&*store).await.unwrap();
    assert_eq!(
        (taken_over.status, taken_over.released.len()),
        (Status::Pending, 1),
        "the second call's claim took the FAILED record over, keeping the token: {taken_over:?}"
    );

    clock.advance(Duration::from_secs(48));
    expiring.delete_expired(clock.now_ms()).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let landed = record(&*store).await;
    let answer = charge(&direct, &runs).await;
    assert!(
        matches!(answer, Ok(3)),
        "the key is not held by a call that gave up: {answer:?}; record after the takeover: \
         {taken_over:?}; after the released claim landed: {landed:?}"
    );
    assert_eq!(runs.count(), 3);
}

idempotent_tests::on_both_stores!(
    a_takeover_by_a_deadline_bound_call_keeps_the_released_tokens_record,
    a_release_on_a_record_expired_by_a_takeover_keeps_earlier_tokens,
    a_slow_takeover_claim_keeps_the_released_tokens_record,
);
