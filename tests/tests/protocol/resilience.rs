//! Waiting for an in-flight call, payload fingerprints, crashes, large responses and retention — on both
//! stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::store::{Change, Transition, WriteOutcome};
use idempotent_runtime::{Error, Idempotency, Status, idempotent};
use idempotent_tests::{AppError, Backend, Gate, Harness, idem_error};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Transfer {
    from: String,
    to: String,
    cents: u64,
}

#[idempotent(key = id, store = idem, name = "resilience::held", wait = "5s", lease = "10s")]
async fn held_waiting(idem: &Idempotency, gate: &Gate, id: u32) -> Result<u32, AppError> {
    held_body(gate, id).await
}

#[idempotent(key = id, store = idem, name = "resilience::held", wait = "300ms", lease = "10s")]
async fn held_short_wait(idem: &Idempotency, gate: &Gate, id: u32) -> Result<u32, AppError> {
    held_body(gate, id).await
}

#[idempotent(key = id, store = idem, name = "resilience::held", lease = "10s")]
async fn held(idem: &Idempotency, gate: &Gate, id: u32) -> Result<u32, AppError> {
    held_body(gate, id).await
}

async fn held_body(gate: &Gate, id: u32) -> Result<u32, AppError> {
    let run = u32::try_from(gate.enter().await?).unwrap();
    Ok(id * 100 + run)
}

#[idempotent(key = t.from, payload = t, store = idem, name = "resilience::transfer")]
async fn transfer(idem: &Idempotency, gate: &Gate, t: &Transfer) -> Result<Transfer, AppError> {
    gate.enter().await?;
    Ok(t.clone())
}

#[idempotent(key = id, store = idem, name = "resilience::big")]
async fn big(
    idem: &Idempotency,
    runs: &AtomicUsize,
    id: u32,
    lines: usize,
    random: bool,
) -> Result<Vec<String>, AppError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok((0..lines)
        .map(|i| {
            if random {
                format!("{:016x}", splitmix(i as u64 + u64::from(id) * 1_000_003))
            } else {
                format!("line number {i}")
            }
        })
        .collect())
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn spawn_held(
    h: &Harness,
    gate: &Arc<Gate>,
    id: u32,
) -> tokio::task::JoinHandle<Result<u32, AppError>> {
    let (idem, gate) = (h.idem.clone(), gate.clone());
    tokio::spawn(async move { held(&idem, &gate, id).await })
}

async fn a_waiting_duplicate_returns_the_result_as_soon_as_it_exists(backend: Backend) {
    let h = Harness::new(backend).await;
    let gate = Arc::new(Gate::default());
    let first = spawn_held(&h, &gate, 1);
    gate.started().await;
    let waiter = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), gate.clone());
        async move { held_waiting(&idem, &gate, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !waiter.is_finished(),
        "the duplicate must wait, not fail fast"
    );
    gate.release();
    assert_eq!(first.await.unwrap().unwrap(), 101);
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        101,
        "the waiter gets the stored result"
    );
    assert_eq!(gate.runs(), 1);
}

async fn a_waiting_duplicate_gives_up_with_in_progress_when_the_wait_runs_out(backend: Backend) {
    let h = Harness::new(backend).await;
    let gate = Arc::new(Gate::default());
    let first = spawn_held(&h, &gate, 2);
    gate.started().await;
    let started = std::time::Instant::now();
    let err = idem_error(held_short_wait(&h.idem, &gate, 2).await);
    assert!(matches!(err, Error::InProgress { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited the whole 300 ms"
    );
    gate.release();
    first.await.unwrap().unwrap();
    assert_eq!(gate.runs(), 1);
}

async fn a_waiting_duplicate_claims_the_key_when_the_first_call_fails(backend: Backend) {
    let h = Harness::new(backend).await;
    let gate = Arc::new(Gate::default());
    gate.fail_next();
    let first = spawn_held(&h, &gate, 3);
    gate.started().await;
    let waiter = tokio::spawn({
        let (idem, gate) = (h.idem.clone(), gate.clone());
        async move { held_waiting(&idem, &gate, 3).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.release();
    gate.release();
    assert!(matches!(first.await.unwrap(), Err(AppError::Declined)));
    assert_eq!(
        waiter.await.unwrap().unwrap(),
        302,
        "the waiter ran the body itself"
    );
    assert_eq!(gate.runs(), 2);
    let record = h.record("resilience::held", &3).await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

async fn a_different_payload_is_rejected_while_pending_and_after_completion(backend: Backend) {
    let h = Harness::new(backend).await;
    let gate = Arc::new(Gate::default());
    let original = Transfer {
        from: "acct-1".into(),
        to: "acct-2".into(),
        cents: 500,
    };
    let tampered = Transfer {
        cents: 50_000,
        ..original.clone()
    };
    let first = tokio::spawn({
        let (idem, gate, t) = (h.idem.clone(), gate.clone(), original.clone());
        async move { transfer(&idem, &gate, &t).await }
    });
    gate.started().await;
    let pending = h.record("resilience::transfer", "acct-1").await.unwrap();
    let err = idem_error(transfer(&h.idem, &gate, &tampered).await);
    assert!(
        matches!(&err, Error::PayloadMismatch { namespace, .. } if namespace == "resilience::transfer"),
        "{err:?}"
    );
    assert_eq!(
        h.record("resilience::transfer", "acct-1").await.unwrap(),
        pending,
        "untouched"
    );
    gate.release();
    assert_eq!(first.await.unwrap().unwrap(), original);
    let completed = h.record("resilience::transfer", "acct-1").await.unwrap();
    assert_eq!(completed.status, Status::Completed);
    let err = idem_error(transfer(&h.idem, &gate, &tampered).await);
    assert!(matches!(err, Error::PayloadMismatch { .. }), "{err:?}");
    assert_eq!(
        h.record("resilience::transfer", "acct-1").await.unwrap(),
        completed,
        "untouched"
    );
    // The same payload is replayed.
    assert_eq!(transfer(&h.idem, &gate, &original).await.unwrap(), original);
    assert_eq!(gate.runs(), 1);
}

async fn a_crashed_call_is_taken_over_after_its_lease_and_its_late_completion_is_rejected(
    backend: Backend,
) {
    let h = Harness::new(backend).await;
    let gate = Arc::new(Gate::default());
    let crashed = spawn_held(&h, &gate, 4);
    gate.started().await;
    crashed.abort();
    assert!(crashed.await.unwrap_err().is_cancelled());
    let record = h.record("resilience::held", &4).await.unwrap();
    assert_eq!(
        record.status,
        Status::Pending,
        "the crash left the claim behind"
    );
    // Within the lease the key is blocked ...
    h.clock.advance(Duration::from_secs(9));
    assert!(matches!(
        idem_error(held(&h.idem, &gate, 4).await),
        Error::InProgress { .. }
    ));
    // ... after it (and the 1 s clock-skew margin), the next call takes over and runs the body.
    h.clock.advance(Duration::from_secs(3));
    gate.release();
    assert_eq!(held(&h.idem, &gate, 4).await.unwrap(), 402);
    let after = h.record("resilience::held", &4).await.unwrap();
    assert_eq!((after.status, after.attempt), (Status::Completed, 2));
    // The crashed worker's token can no longer complete.
    let late = h
        .store
        .transition(&Transition::new(
            &record.key,
            &record.token,
            Change::Complete {
                response: Some(b"1"),
                expires_at_s: u64::MAX / 2,
                replay_until_s: None,
            },
        ))
        .await
        .unwrap();
    assert!(matches!(late, WriteOutcome::Rejected(Some(_))));
    assert_eq!(h.record("resilience::held", &4).await.unwrap(), after);
}

async fn a_large_response_is_compressed_and_replayed(backend: Backend) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    // About 1.3 MB of JSON: over the 400 KB item limit unless compressed.
    let first = big(&h.idem, &runs, 1, 80_000, false).await.unwrap();
    let record = h.record("resilience::big", &1).await.unwrap();
    let stored = record.response.as_ref().unwrap();
    assert!(stored.starts_with(&[0x1f, 0x8b]), "stored gzip-compressed");
    assert!(stored.len() < 400 * 1024, "{} bytes", stored.len());
    assert_eq!(big(&h.idem, &runs, 1, 80_000, false).await.unwrap(), first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

async fn a_response_too_large_even_compressed_is_stored_without_a_body_and_never_runs_twice(
    backend: Backend,
) {
    let h = Harness::new(backend).await;
    let runs = AtomicUsize::new(0);
    // 100,000 random 16-hex-digit strings: 1.9 MB of JSON that gzip cannot shrink below 400 KB.
    let first = big(&h.idem, &runs, 2, 100_000, true).await.unwrap();
    assert_eq!(first.len(), 100_000, "the first caller gets its value");
    let record = h.record("resilience::big", &2).await.unwrap();
    assert_eq!(
        (record.status, record.response.as_ref().map(Vec::len)),
        (Status::Completed, None)
    );
    let err = idem_error(big(&h.idem, &runs, 2, 100_000, true).await);
    assert!(
        matches!(&err, Error::ResponseTooLarge { namespace, .. } if namespace == "resilience::big"),
        "{err:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body never runs twice");
}

idempotent_tests::on_both_stores! {
    mod memory, mod dynamodb;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_waiting_duplicate_returns_the_result_as_soon_as_it_exists,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_waiting_duplicate_gives_up_with_in_progress_when_the_wait_runs_out,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_waiting_duplicate_claims_the_key_when_the_first_call_fails,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_different_payload_is_rejected_while_pending_and_after_completion,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_crashed_call_is_taken_over_after_its_lease_and_its_late_completion_is_rejected,
    #[tokio::test]
    a_large_response_is_compressed_and_replayed,
    #[tokio::test]
    a_response_too_large_even_compressed_is_stored_without_a_body_and_never_runs_twice,
}

#[idempotent(key = id, store = idem, name = "resilience::retained", ttl = "1h")]
async fn retained(idem: &Idempotency, runs: &AtomicUsize, id: u32) -> Result<u32, AppError> {
    Ok(u32::try_from(runs.fetch_add(1, Ordering::SeqCst)).unwrap() + id)
}

async fn retention(backend: Backend) {
    let with = Harness::with(backend, |b| b.retain(Duration::from_hours(7 * 24))).await;
    let without = Harness::new(backend).await;
    for (h, retains) in [(&with, true), (&without, false)] {
        let runs = AtomicUsize::new(0);
        assert_eq!(retained(&h.idem, &runs, 10).await.unwrap(), 10);
        h.clock.advance(Duration::from_mins(50));
        assert_eq!(
            retained(&h.idem, &runs, 10).await.unwrap(),
            10,
            "replayed within ttl"
        );
        h.clock.advance(Duration::from_secs(700));
        let late = retained(&h.idem, &runs, 10).await;
        if retains {
            let err = idem_error(late);
            assert!(
                matches!(&err, Error::Expired { namespace, .. } if namespace == "resilience::retained"),
                "{err:?}"
            );
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "the tombstone stops a very late duplicate"
            );
            // After the retention, the key is new.
            h.clock.advance(Duration::from_hours(7 * 24));
            assert_eq!(retained(&h.idem, &runs, 10).await.unwrap(), 11);
        } else {
            assert_eq!(
                late.unwrap(),
                11,
                "without retention, expiry means the key is new"
            );
        }
    }
}

#[tokio::test]
async fn retention_keeps_a_tombstone_past_the_ttl_on_memory() {
    retention(Backend::Memory).await;
}

#[tokio::test]
async fn retention_keeps_a_tombstone_past_the_ttl_on_dynamodb() {
    retention(Backend::DynamoDb).await;
}
