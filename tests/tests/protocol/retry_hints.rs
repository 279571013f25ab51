//! `Error::InProgress`'s `retry_hint`, and the HTTP layer's `Retry-After`, follow the record: the short
//! hint while the holder's heartbeats keep moving its lease, the time left on the lease (whole seconds,
//! rounded up, never zero) once they stopped. On both stores, with the injectable clock.
//!
//! The rule, with the defaults of these tests (a 30 s lease, so a heartbeat every 10 s, and the 1 s
//! clock-skew margin): a claim whose lease has not moved for more than 11 s is stalled.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_runtime::{Error, Idempotency, Status};
use idempotent_tests::{Backend, Harness};

const NS: &str = "hints::charge";
const LEASE: Duration = Duration::from_secs(30);

/// One call of the operation under test, whose body counts its runs and answers at once.
async fn call(idem: &Idempotency, key: &str, runs: &AtomicUsize) -> Result<u32, Error> {
    idem.operation(NS, &key)
        .run(|_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<u32, Error>(7)
        })
        .await
}

/// `(retry_after, retry_hint)` of the `InProgress` a duplicate gets now.
async fn hint(idem: &Idempotency, key: &str) -> (Duration, Duration) {
    let runs = AtomicUsize::new(0);
    let err = call(idem, key, &runs).await.unwrap_err();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a duplicate never runs the body"
    );
    let Error::InProgress {
        retry_after,
        retry_hint,
        ..
    } = err
    else {
        panic!("expected InProgress, got {err:?}")
    };
    (retry_after, retry_hint)
}

/// A claim on `key` whose worker died mid-body: its call's future is dropped once the body runs, so
/// no heartbeat extends its lease again (a call dropped before its body started would release it).
async fn dead_worker(idem: &Idempotency, key: &'static str) {
    let (started, body_runs) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn({
        let idem = idem.clone();
        async move {
            idem.operation(NS, &key)
                .run(|_| async move {
                    let _ = started.send(());
                    std::future::pending::<Result<u32, Error>>().await
                })
                .await
        }
    });
    body_runs.await.unwrap();
    worker.abort();
    assert!(worker.await.unwrap_err().is_cancelled());
}

async fn a_dead_workers_claim_gets_the_time_left_on_its_lease(backend: Backend) {
    let h = Harness::with(backend, |b| b.default_lease(LEASE)).await;
    dead_worker(&h.idem, "o-1").await;
    let record = h.record(NS, &"o-1").await.unwrap();
    assert_eq!(record.status, Status::Pending);

    // Just claimed: it may be alive. 30 s of lease and the 1 s margin before a takeover.
    assert_eq!(
        hint(&h.idem, "o-1").await,
        (Duration::from_secs(31), Duration::from_secs(1))
    );
    // 11 s without a heartbeat: one was due at 10 s, and the holder's clock may be 1 s behind.
    h.clock.advance(Duration::from_secs(11));
    assert_eq!(
        hint(&h.idem, "o-1").await,
        (Duration::from_secs(20), Duration::from_secs(1)),
        "exactly at the boundary, the holder is not late yet"
    );
    // A millisecond later it is stalled: the time until the key can be taken over (it lapses one
    // millisecond after the 19.999 s left), in whole seconds.
    h.clock.advance(Duration::from_millis(1));
    assert_eq!(
        hint(&h.idem, "o-1").await,
        (Duration::from_millis(19_999), Duration::from_secs(20))
    );
    h.clock.advance(Duration::from_secs(2));
    assert_eq!(hint(&h.idem, "o-1").await.1, Duration::from_secs(18));
    // Half a second left: rounded up, never zero.
    h.clock.advance(Duration::from_millis(17_499));
    assert_eq!(
        hint(&h.idem, "o-1").await,
        (Duration::from_millis(500), Duration::from_secs(1))
    );
    // The lease's very end (not lapsed yet: a takeover needs the clock strictly past it).
    h.clock.advance(Duration::from_millis(500));
    assert_eq!(
        hint(&h.idem, "o-1").await,
        (Duration::ZERO, Duration::from_secs(1))
    );
    // One millisecond later the key is taken over, and its body runs once.
    h.clock.advance(Duration::from_millis(1));
    let runs = AtomicUsize::new(0);
    assert_eq!(call(&h.idem, "o-1", &runs).await.unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let record = h.record(NS, &"o-1").await.unwrap();
    assert_eq!((record.status, record.attempt), (Status::Completed, 2));
}

#[tokio::test]
async fn a_dead_workers_claim_gets_the_time_left_on_its_lease_memory() {
    a_dead_workers_claim_gets_the_time_left_on_its_lease(Backend::Memory).await;
}

#[tokio::test]
async fn a_dead_workers_claim_gets_the_time_left_on_its_lease_dynamodb() {
    a_dead_workers_claim_gets_the_time_left_on_its_lease(Backend::DynamoDb).await;
}

/// A live holder's heartbeats move its lease (every third of it, on the runtime's timer), so however
/// long it has run by the clock, a duplicate gets the short hint.
async fn a_live_holder_with_heartbeats_gets_the_short_hint(backend: Backend) {
    // A 3 s lease: a heartbeat every second of real time.
    let lease = Duration::from_secs(3);
    let h = Harness::with(backend, |b| b.default_lease(lease)).await;
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (started, body_runs) = tokio::sync::oneshot::channel::<()>();
    let holder = tokio::spawn({
        let (idem, release) = (h.idem.clone(), release.clone());
        async move {
            idem.operation(NS, &"o-2")
                .run(|_| async move {
                    let _ = started.send(());
                    let _permit = release.acquire().await;
                    Ok::<u32, Error>(8)
                })
                .await
        }
    });
    body_runs.await.unwrap();
    let claimed_until = h.record(NS, &"o-2").await.unwrap().lease_until_ms.unwrap();
    // Far past a heartbeat interval by the clock; the next heartbeat counts from here.
    h.clock.advance(Duration::from_millis(2_500));
    let beat_until = claimed_until + 2_500;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.record(NS, &"o-2").await.unwrap().lease_until_ms != Some(beat_until) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeat landed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The lease was just extended: 3 s, plus the margin.
    assert_eq!(
        hint(&h.idem, "o-2").await,
        (Duration::from_secs(4), Duration::from_secs(1))
    );
    release.add_permits(1);
    assert_eq!(holder.await.unwrap().unwrap(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_with_heartbeats_gets_the_short_hint_memory() {
    a_live_holder_with_heartbeats_gets_the_short_hint(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_holder_with_heartbeats_gets_the_short_hint_dynamodb() {
    a_live_holder_with_heartbeats_gets_the_short_hint(Backend::DynamoDb).await;
}

/// With heartbeats off a lease never moves, so a dead worker cannot be told from a live one whose
/// result may come at any moment: the short hint, whatever is left of the lease.
async fn without_heartbeats_the_hint_stays_short(backend: Backend) {
    let h = Harness::with(backend, |b| b.default_lease(LEASE).heartbeat(false)).await;
    dead_worker(&h.idem, "o-3").await;
    h.clock.advance(Duration::from_secs(20));
    assert_eq!(
        hint(&h.idem, "o-3").await,
        (Duration::from_secs(11), Duration::from_secs(1))
    );
}

#[tokio::test]
async fn without_heartbeats_the_hint_stays_short_memory() {
    without_heartbeats_the_hint_stays_short(Backend::Memory).await;
}

#[tokio::test]
async fn without_heartbeats_the_hint_stays_short_dynamodb() {
    without_heartbeats_the_hint_stays_short(Backend::DynamoDb).await;
}

/// A longer configured hint is still capped by the lease's end for a live claim, and a stalled claim
/// is judged by the caller's own lease: a holder that claimed with a longer lease than the caller's
/// looks live to it.
#[tokio::test]
async fn the_hint_is_judged_with_the_callers_lease() {
    let h = Harness::with(Backend::Memory, |b| {
        b.default_lease(LEASE).retry_hint(Duration::from_secs(5))
    })
    .await;
    dead_worker(&h.idem, "o-4").await;
    assert_eq!(hint(&h.idem, "o-4").await.1, Duration::from_secs(5));
    // Stalled, 19 s left: the key lapses just after, so 20 s.
    h.clock.advance(Duration::from_secs(12));
    assert_eq!(hint(&h.idem, "o-4").await.1, Duration::from_secs(20));
    // A caller whose lease is 90 s (a heartbeat every 30 s) sees a claim with 19 s left as stalled
    // too; one whose lease is 15 s sees it as extended a moment ago (19 s > 15 s - 5 s).
    let op = |lease: Duration| {
        let idem = h.idem.clone();
        async move {
            idem.operation(NS, &"o-4")
                .lease(lease)
                .run(|_| async { Ok::<u32, Error>(0) })
                .await
                .unwrap_err()
        }
    };
    let Error::InProgress { retry_hint, .. } = op(Duration::from_secs(90)).await else {
        panic!()
    };
    assert_eq!(retry_hint, Duration::from_secs(20));
    let Error::InProgress { retry_hint, .. } = op(Duration::from_secs(15)).await else {
        panic!()
    };
    assert_eq!(retry_hint, Duration::from_secs(5));
}

/// Through the HTTP layer: a request whose client hung up while its handler ran (with
/// `cancel_with_client`, the handler is dropped with it, heartbeats and all) leaves its key PENDING.
/// A retry gets `Retry-After: 1` while the claim may be alive, then the seconds left on its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_sends_the_time_left_once_the_handler_is_gone() {
    use std::sync::atomic::AtomicBool;

    use axum::body::Bytes;
    use axum::http::{Request, StatusCode};
    use http_body_util::{BodyExt as _, Full};
    use idempotent_runtime::http::IdempotencyLayer;

    /// Set when the handler's future is dropped.
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    let h = Harness::with(Backend::Memory, |b| b.default_lease(LEASE)).await;
    let started = Arc::new(tokio::sync::Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, dropped) = (started.clone(), dropped.clone());
        move || {
            let (started, dropped) = (started.clone(), dropped.clone());
            async move {
                let _guard = Dropped(dropped);
                started.notify_one();
                std::future::pending::<()>().await;
                StatusCode::CREATED
            }
        }
    };
    let layer = IdempotencyLayer::new(h.idem.clone(), |_| Some("acme".to_owned()))
        .namespace("hints")
        .cancel_with_client();
    let app = axum::Router::new().route("/pay", axum::routing::post(handler).layer(layer));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let post = move || {
        let request = Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", "k-1")
            .body(Full::new(Bytes::from_static(b"{\"amount\":1}")))
            .unwrap();
        client.request(request)
    };

    let first = tokio::spawn(post());
    started.notified().await;
    first.abort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handler was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = h.record("hints", &("acme", "k-1")).await.unwrap();
    assert_eq!(record.status, Status::Pending);

    let retry_after = || async {
        let response = post().await.unwrap();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        let value = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .to_owned();
        let _ = response.into_body().collect().await.unwrap();
        value
    };
    assert_eq!(retry_after().await, "1");
    h.clock.advance(Duration::from_millis(11_001));
    assert_eq!(retry_after().await, "20");
}

/// The longest lease a handle accepts (100 years): half of it gone without a heartbeat, the hint is
/// the other half, to the second, without overflow anywhere on the way.
async fn a_century_lease_gives_a_hint_of_decades(backend: Backend) {
    let century = idempotent_runtime::MAX_DURATION;
    let h = Harness::with(backend, |b| b.default_lease(century)).await;
    dead_worker(&h.idem, "o-5").await;
    h.clock.advance(century / 2);
    let (retry_after, retry_hint) = hint(&h.idem, "o-5").await;
    assert_eq!(retry_after, century / 2 + Duration::from_secs(1));
    assert_eq!(retry_hint, retry_after + Duration::from_secs(1));
}

#[tokio::test]
async fn a_century_lease_gives_a_hint_of_decades_memory() {
    a_century_lease_gives_a_hint_of_decades(Backend::Memory).await;
}

#[tokio::test]
async fn a_century_lease_gives_a_hint_of_decades_dynamodb() {
    a_century_lease_gives_a_hint_of_decades(Backend::DynamoDb).await;
}
