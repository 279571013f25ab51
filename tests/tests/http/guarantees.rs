//! What `IdempotencyLayer` promises when routing, responses or connections are not the plain case, over a
//! real loopback connection on both stores: a nested router's prefix is part of the request, a response
//! too large to store (or whose body fails) is final and never runs twice, rejections of the request's
//! form are not stored, representation headers are replayed, a client that hangs up does not cancel the
//! handler, and a panicking handler answers 500 and leaves its key free.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use idempotent_runtime::http::{Final, IdempotencyLayer};
use idempotent_runtime::store::conformance::{Delegating, Override};
use idempotent_runtime::{MemoryStore, Status, Store, StoreError};
use idempotent_tests::{Backend, Harness};
use serde_json::Value;

const NAMESPACE: &str = "http-guarantees";
const TENANT: &str = "acme";

idempotent_tests::on_both_stores!(
    a_nested_router_never_replays_another_prefixes_response,
    a_response_over_the_stored_limit_is_final_and_streamed_to_the_first_caller,
    a_response_over_the_item_limit_replays_as_processed_never_retry,
    a_response_body_that_fails_mid_stream_is_final,
    rejections_of_the_requests_form_are_not_stored,
    representation_headers_are_replayed,
    a_client_that_hangs_up_does_not_cancel_the_handler,
    drain_waits_for_a_handler_whose_client_hung_up,
    a_panicking_handler_answers_500_and_leaves_the_key_free,
    a_body_that_panics_after_a_stored_status_is_final,
    a_final_rejection_and_a_configured_status_are_stored,
    cancel_with_client_stops_the_handler_with_its_client,
    the_request_and_stored_response_limits_are_separate_settings,
    a_rewritten_route_never_replays_another_routes_response,
    identical_bytes_in_another_content_encoding_are_another_request,
    utf8_representation_headers_are_replayed,
    a_request_body_that_fails_is_400_not_413,
    a_panicking_identity_function_answers_500_and_leaves_the_key_free,
    header_values_that_are_not_utf8_are_replayed_byte_for_byte,
    a_replay_sends_only_the_headers_the_layer_stores,
    a_retry_gzipped_again_is_replayed,
    a_retry_with_a_new_multipart_boundary_is_replayed,
    a_fingerprint_of_the_services_own_decides_what_is_the_same_request,
    trailers_pass_through_and_replay_over_http1,
    trailers_pass_through_and_replay_over_http2,
    a_client_that_resets_its_http2_stream_does_not_cancel_the_handler,
    identical_requests_at_once_get_409_and_with_wait_the_first_ones_response,
);

/// A router on `harness`'s handle, served on a free loopback port.
struct Server {
    addr: SocketAddr,
    harness: Harness,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What came back: the body, or the error that cut it short.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Bytes, String>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn bytes(&self) -> &Bytes {
        self.body.as_ref().expect("a whole body")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(self.bytes()).unwrap_or(Value::Null)
    }
}

/// The layer every test starts from: keys scoped by one tenant, in [`NAMESPACE`].
fn layer(harness: &Harness) -> IdempotencyLayer {
    IdempotencyLayer::new(harness.idem.clone(), |_: &axum::http::request::Parts| {
        Some(TENANT.to_owned())
    })
    .namespace(NAMESPACE)
}

impl Server {
    async fn start(harness: Harness, router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Self {
            addr,
            harness,
            client,
        }
    }

    fn request(&self, path: &str, key: &str) -> axum::http::request::Builder {
        Request::post(format!("http://{}{path}", self.addr)).header("idempotency-key", key)
    }

    /// Sends `request`; `Err` when no response came at all.
    async fn send(
        &self,
        request: axum::http::request::Builder,
        body: &str,
    ) -> Result<Reply, String> {
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| format!("{e:?}"));
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
        self.send(
            self.request(path, key)
                .header(header::CONTENT_TYPE, "application/json"),
            body,
        )
        .await
        .expect("a response")
    }

    async fn record(&self, key: &str) -> Option<idempotent_runtime::Record> {
        self.harness.record(NAMESPACE, &(TENANT, key)).await
    }
}

/// Counts a handler's runs.
#[derive(Debug, Default, Clone)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    /// Counts one more run; which one this is (1, 2, ...).
    fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn assert_problem(reply: &Reply, status: StatusCode) {
    assert_eq!(reply.status, status, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["status"], status.as_u16(), "{reply:?}");
    assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

/// The answer to a retry of a request whose response was not stored: a clear "processed" answer, never
/// an invitation to retry.
fn assert_processed_not_replayable(reply: &Reply, original: Option<u16>) {
    assert_problem(reply, StatusCode::GONE);
    assert_eq!(
        reply.header("idempotent-replayed"),
        Some("true"),
        "{reply:?}"
    );
    let body = reply.json();
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("processed"), "{detail}");
    assert!(!detail.contains("retry with the same key"), "{detail}");
    assert_eq!(
        body["original_status"].as_u64(),
        original.map(u64::from),
        "{reply:?}"
    );
}

/// A handler that charges (counts a run) and answers 201 with its run number.
fn charge(runs: &Runs) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move || {
        let runs = runs.clone();
        async move { (StatusCode::CREATED, format!("charge {}", runs.next())) }
    })
}

// The layer once fingerprinted the path axum hands it, from which `nest` strips the
// prefix, so account B's payment got account A's 201 replayed, and a live request the test mode's.
async fn a_nested_router_never_replays_another_prefixes_response(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let accounts = Router::new().route("/payments", charge(&runs).layer(layer(&harness)));
    let modes = Router::new().route("/payments", charge(&runs).layer(layer(&harness)));
    let router = Router::new()
        .nest("/accounts/{account}", accounts)
        .nest("/test", modes.clone())
        .nest("/live", modes);
    let server = Server::start(harness, router).await;

    let a = server.post("/accounts/A/payments", "k-1", "{}").await;
    assert_eq!(
        (a.status, a.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..])
    );
    let b = server.post("/accounts/B/payments", "k-1", "{}").await;
    assert_eq!(
        b.header("idempotent-replayed"),
        None,
        "A's response replayed to B: {b:?}"
    );
    assert_problem(&b, StatusCode::UNPROCESSABLE_ENTITY);

    let test = server.post("/test/payments", "k-2", "{}").await;
    assert_eq!(test.status, StatusCode::CREATED);
    let live = server.post("/live/payments", "k-2", "{}").await;
    assert_eq!(
        live.header("idempotent-replayed"),
        None,
        "test mode's response replayed live: {live:?}"
    );
    assert_problem(&live, StatusCode::UNPROCESSABLE_ENTITY);
    // Each still replays its own.
    let again = server.post("/accounts/A/payments", "k-1", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.bytes(), a.bytes());
    assert_eq!(runs.count(), 2, "A's payment and the test mode's");
}

/// The byte at `i` of a [`chunked`] body.
fn letter(i: usize) -> u8 {
    b"abcdefghijklmnopqrstuvwxyz"[i % 26]
}

/// A body of `len` bytes in chunks of 64 KiB, as a handler streaming a large answer sends it.
fn chunked(len: usize) -> Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = (0..len)
        .step_by(64 << 10)
        .map(|at| {
            let end = (at + (64 << 10)).min(len);
            Ok(Bytes::from((at..end).map(letter).collect::<Vec<u8>>()))
        })
        .collect();
    Body::from_stream(futures_util::stream::iter(chunks))
}

// A 2 MiB answer, over the layer's 1 MiB default, once became a 500, the record
// FAILED, and the retry charged again.
async fn a_response_over_the_stored_limit_is_final_and_streamed_to_the_first_caller(
    backend: Backend,
) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let len = 2 << 20;
    let handler = {
        let runs = runs.clone();
        post(move || {
            let runs = runs.clone();
            async move {
                runs.next();
                (
                    StatusCode::CREATED,
                    [(header::LOCATION, "/payments/pay_1")],
                    chunked(len),
                )
            }
        })
    };
    let router = Router::new().route("/payments", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;

    let first = server.post("/payments", "big", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.header("location"), Some("/payments/pay_1"));
    let body = first.bytes();
    assert_eq!(
        body.len(),
        len,
        "the whole body, streamed past what is buffered"
    );
    assert!(body.iter().enumerate().all(|(i, b)| *b == letter(i)));
    let record = server.record("big").await.expect("a record");
    assert_eq!(record.status, Status::Completed, "{record:?}");

    let retry = server.post("/payments", "big", "{}").await;
    assert_processed_not_replayable(&retry, Some(201));
    assert_eq!(runs.count(), 1, "charged once");
}

// A response under the layer's limit but over DynamoDB's 400 KB item is stored as COMPLETED without
// a body; the retry once got a 500 saying "retry with the same key" for 24 hours.
async fn a_response_over_the_item_limit_replays_as_processed_never_retry(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    // 700 KiB that compress poorly (a pseudo-random byte sequence, stored as hex).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Bytes = (0..700 << 10)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect::<Vec<u8>>()
        .into();
    let handler = {
        let (runs, noise) = (runs.clone(), noise.clone());
        post(move || {
            let (runs, noise) = (runs.clone(), noise.clone());
            async move {
                runs.next();
                (StatusCode::CREATED, noise)
            }
        })
    };
    let router = Router::new().route("/payments", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;

    let first = server.post("/payments", "700k", "{}").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.bytes(), &noise);
    let record = server.record("700k").await.expect("a record");
    assert_eq!(record.status, Status::Completed);

    let retry = server.post("/payments", "700k", "{}").await;
    assert_processed_not_replayable(&retry, None);
    assert_eq!(runs.count(), 1, "charged once");
}

// A body whose stream fails after the handler returned 201 once became a 500, the record
// FAILED, and the retry ran the handler again. Twice: a failure within what is read for the record (the
// client gets the handler's broken response, which hyper may cut before its head), and one after 1.5 MiB
// (the client gets the 201 and the first bytes, then the failure).
async fn a_response_body_that_fails_mid_stream_is_final(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move |body: Bytes| {
            let runs = runs.clone();
            async move {
                runs.next();
                let before: usize = String::from_utf8_lossy(&body).parse().unwrap();
                let mut chunks: Vec<Result<Bytes, std::io::Error>> = (0..before / 10_000)
                    .map(|_| Ok(Bytes::from(vec![b'x'; 10_000])))
                    .collect();
                chunks.push(Err(std::io::Error::other("the report's disk went away")));
                (
                    StatusCode::CREATED,
                    Body::from_stream(futures_util::stream::iter(chunks)),
                )
            }
        })
    };
    let router = Router::new().route("/reports", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;

    for (key, before) in [("r-small", 10_000), ("r-large", 1_500_000)] {
        let first = server
            .send(
                server
                    .request("/reports", key)
                    .header(header::CONTENT_TYPE, "application/json"),
                &before.to_string(),
            )
            .await;
        match &first {
            // Hyper closed the connection on the body's error before it sent the head.
            Err(e) => assert!(before < 1 << 20, "no head for {key}: {e}"),
            Ok(first) => {
                assert_eq!(
                    first.status,
                    StatusCode::CREATED,
                    "the handler's own status: {first:?}"
                );
                assert!(
                    first.body.is_err(),
                    "the body fails as the handler's did: {first:?}"
                );
            }
        }
        if before > 1 << 20 {
            assert!(first.is_ok(), "the head of a streamed response");
        }
        let record = server.record(key).await.expect("a record");
        assert_eq!(record.status, Status::Completed, "{key}: {record:?}");

        let retry = server.post("/reports", key, &before.to_string()).await;
        assert_processed_not_replayable(&retry, Some(201));
    }
    assert_eq!(runs.count(), 2, "each ran once");
}

// Axum's 415 for a request without `Content-Type` was once stored, and the corrected
// retry with the same key got the 415 replayed; a 422 for a body that does not fit the type made the
// corrected body a key reuse (422 from the layer). Business outcomes (402) stay stored.
async fn rejections_of_the_requests_form_are_not_stored(backend: Backend) {
    #[derive(serde::Deserialize)]
    struct NewPayment {
        amount: u64,
    }
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move |axum::Json(new): axum::Json<NewPayment>| {
            let runs = runs.clone();
            async move {
                let run = runs.next();
                if new.amount > 1_000 {
                    return (StatusCode::PAYMENT_REQUIRED, "declined").into_response();
                }
                (StatusCode::CREATED, format!("charge {run}")).into_response()
            }
        })
    };
    let router = Router::new().route("/payments", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;

    // No Content-Type: axum's 415, before the handler runs.
    let bare = server
        .send(server.request("/payments", "k-415"), r#"{"amount":5}"#)
        .await
        .unwrap();
    assert_eq!(bare.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let fixed = server.post("/payments", "k-415", r#"{"amount":5}"#).await;
    assert_eq!(
        fixed.header("idempotent-replayed"),
        None,
        "the 415 replayed: {fixed:?}"
    );
    assert_eq!(
        (fixed.status, fixed.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..])
    );

    // A body that is JSON but not a payment: axum's 422; the corrected body runs.
    let wrong = server
        .post("/payments", "k-422", r#"{"amount":"five"}"#)
        .await;
    assert_eq!(wrong.status, StatusCode::UNPROCESSABLE_ENTITY);
    let fixed = server.post("/payments", "k-422", r#"{"amount":5}"#).await;
    assert_eq!(
        (fixed.status, fixed.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 2"[..]),
        "{fixed:?}"
    );

    // A declined payment is the business's answer: stored and replayed.
    let declined = server
        .post("/payments", "k-402", r#"{"amount":5000}"#)
        .await;
    assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
    let again = server
        .post("/payments", "k-402", r#"{"amount":5000}"#)
        .await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.count(), 3);
}

// A gzip-encoded response was once replayed without its `Content-Encoding`, so the
// client read compressed bytes as the body.
async fn representation_headers_are_replayed(backend: Backend) {
    let harness = Harness::new(backend).await;
    // The first bytes of a gzip stream, and bytes that are not UTF-8 (stored as hex).
    let encoded = Bytes::from_static(&[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x00, 0x41]);
    let handler = {
        let encoded = encoded.clone();
        post(move || {
            let encoded = encoded.clone();
            async move {
                (
                    StatusCode::CREATED,
                    [
                        (header::CONTENT_TYPE, "application/json"),
                        (header::CONTENT_ENCODING, "gzip"),
                        (header::CONTENT_LANGUAGE, "de"),
                        (header::CONTENT_LOCATION, "/payments/pay_1"),
                    ],
                    encoded,
                )
            }
        })
    };
    let router = Router::new().route("/payments", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server.post("/payments", "gz", "{}").await;
    let again = server.post("/payments", "gz", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    for reply in [&first, &again] {
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.bytes(), &encoded);
        assert_eq!(reply.header("content-encoding"), Some("gzip"), "{reply:?}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.header("content-language"), Some("de"));
        assert_eq!(reply.header("content-location"), Some("/payments/pay_1"));
    }
}

/// Sends a POST with `key` over a connection of its own, and closes the connection 100 ms after the
/// handler started (`started`), without waiting for the answer, as a client that times out does.
async fn post_and_hang_up(addr: SocketAddr, path: &str, key: &str, started: impl Fn() -> bool) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let request = Request::post(format!("http://{addr}{path}"))
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let patience = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !started() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the handler never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::select! {
        answer = sender.send_request(request) => panic!("the handler answered: {answer:?}"),
        () = patience => {}
    }
    // Dropping the connection's task closes the socket: the server reads EOF.
    connection.abort();
    drop(sender);
}

/// `POST /payments` behind the layer: sends a charge (counted in `charges`), then waits 800 ms for the
/// gateway's answer and answers 201 `charge <n>`.
fn slow_charge(harness: &Harness, charges: &Runs) -> Router {
    let charges = charges.clone();
    let handler = post(move || {
        let charges = charges.clone();
        async move {
            let charge = charges.next();
            tokio::time::sleep(Duration::from_millis(800)).await;
            (StatusCode::CREATED, format!("charge {charge}"))
        }
    });
    Router::new().route("/payments", handler.layer(layer(harness)))
}

// A client that timed out and hung up once made hyper drop the handler's future; nothing
// was stored, the heartbeat stopped, and the retry after the lease charged a second time.
async fn a_client_that_hangs_up_does_not_cancel_the_handler(backend: Backend) {
    let harness = Harness::with(backend, |b| b.default_lease(Duration::from_secs(1))).await;
    let charges = Runs::default();
    let router = slow_charge(&harness, &charges);
    let server = Server::start(harness, router).await;

    post_and_hang_up(server.addr, "/payments", "hang-up", || charges.count() == 1).await;
    // Give the handler the time it needs, then let the lease lapse for anything still PENDING.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline
        && server
            .record("hang-up")
            .await
            .is_none_or(|r| r.status != Status::Completed)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.harness.clock.advance(Duration::from_secs(3));

    let retry = server.post("/payments", "hang-up", "{}").await;
    assert_eq!(charges.count(), 1, "charged twice: {retry:?}");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.bytes().as_ref(), b"charge 1");
}

// The layer's handler tasks are the handle's, so a graceful shutdown that drains the
// handle waits for a handler whose client left, and its response is stored when `drain` returns.
async fn drain_waits_for_a_handler_whose_client_hung_up(backend: Backend) {
    let harness = Harness::with(backend, |b| b.default_lease(Duration::from_secs(30))).await;
    let charges = Runs::default();
    let router = slow_charge(&harness, &charges);
    let server = Server::start(harness, router).await;

    post_and_hang_up(server.addr, "/payments", "drain", || charges.count() == 1).await;
    let left = server.harness.idem.drain(Duration::from_secs(10)).await;
    assert_eq!(left, 0, "a handler task was still running after drain");
    let record = server.record("drain").await.expect("a record");
    assert_eq!(record.status, Status::Completed, "{record:?}");
    assert_eq!(charges.count(), 1);
}

// A panicking handler once dropped the connection without an answer and left its key
// PENDING for the whole lease.
async fn a_panicking_handler_answers_500_and_leaves_the_key_free(backend: Backend) {
    let harness = Harness::with(backend, |b| b.default_lease(Duration::from_secs(30))).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move || {
            let runs = runs.clone();
            async move {
                let run = runs.next();
                assert!(run > 1, "the gateway client panicked on run {run}");
                Response::builder()
                    .status(StatusCode::CREATED)
                    .body(Body::from(format!("charge {run}")))
                    .unwrap()
            }
        })
    };
    let router = Router::new().route("/payments", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;

    let first = server
        .send(
            server
                .request("/payments", "boom")
                .header(header::CONTENT_TYPE, "application/json"),
            "{}",
        )
        .await;
    let first = first.expect("an answer, not a dropped connection");
    assert_problem(&first, StatusCode::INTERNAL_SERVER_ERROR);
    // The key is free, so a retry runs the handler again: the answer says so, and promises no less.
    let detail = first.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("runs the handler again"), "{detail}");
    assert!(!detail.contains("nothing was stored"), "{detail}");
    let record = server.record("boom").await.expect("a record");
    assert_eq!(record.status, Status::Failed, "{record:?}");
    assert!(
        record
            .error
            .as_deref()
            .is_some_and(|e| e.contains("panicked")),
        "{record:?}"
    );

    let retry = server.post("/payments", "boom", "{}").await;
    assert_eq!(
        (retry.status, retry.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 2"[..]),
        "{retry:?}"
    );
    assert_eq!(retry.header("idempotent-replayed"), None);
}

/// A route at `path` answering `status` (marked [`Final`] when `mark`), counting its runs.
fn answering(runs: &Runs, status: StatusCode, mark: bool) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move || {
        let runs = runs.clone();
        async move {
            let run = runs.next();
            let mut response = (status, format!("run {run}")).into_response();
            if mark {
                response = (Final, response).into_response();
            }
            response
        }
    })
}

// A rejection the handler marks final, and a status the layer is told to store, are stored and replayed.
async fn a_final_rejection_and_a_configured_status_are_stored(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let router = Router::new()
        .route(
            "/frozen",
            answering(&runs, StatusCode::FORBIDDEN, true).layer(layer(&harness)),
        )
        .route(
            "/cancelled",
            answering(&runs, StatusCode::NOT_FOUND, false)
                .layer(layer(&harness).store_status(StatusCode::NOT_FOUND, true)),
        )
        .route(
            "/accepted",
            answering(&runs, StatusCode::ACCEPTED, false)
                .layer(layer(&harness).store_status(StatusCode::ACCEPTED, false)),
        )
        .route(
            "/forbidden",
            answering(&runs, StatusCode::FORBIDDEN, false).layer(layer(&harness)),
        );
    let server = Server::start(harness, router).await;
    for (path, status, stored) in [
        ("/frozen", StatusCode::FORBIDDEN, true),
        ("/cancelled", StatusCode::NOT_FOUND, true),
        ("/accepted", StatusCode::ACCEPTED, false),
        ("/forbidden", StatusCode::FORBIDDEN, false),
    ] {
        let before = runs.count();
        let first = server.post(path, path, "{}").await;
        let again = server.post(path, path, "{}").await;
        assert_eq!((first.status, again.status), (status, status), "{path}");
        assert_eq!(
            again.header("idempotent-replayed").is_some(),
            stored,
            "{path}: {again:?}"
        );
        assert_eq!(runs.count() - before, if stored { 1 } else { 2 }, "{path}");
        let record = server.record(path).await.expect("a record");
        let expected = if stored {
            Status::Completed
        } else {
            Status::Failed
        };
        assert_eq!(record.status, expected, "{path}");
    }
}

// The opt-out: a handler that must stop with its client is cancelled when the client hangs up, and its
// key stays PENDING (it may have had effects) until the lease runs out.
async fn cancel_with_client_stops_the_handler_with_its_client(backend: Backend) {
    let harness = Harness::with(backend, |b| b.default_lease(Duration::from_secs(30))).await;
    let (started, finished) = (Runs::default(), Runs::default());
    let handler = {
        let (started, finished) = (started.clone(), finished.clone());
        post(move || {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.next();
                tokio::time::sleep(Duration::from_millis(500)).await;
                finished.next();
                StatusCode::CREATED
            }
        })
    };
    let router = Router::new().route(
        "/exports",
        handler.layer(layer(&harness).cancel_with_client()),
    );
    let server = Server::start(harness, router).await;
    post_and_hang_up(server.addr, "/exports", "x-1", || started.count() == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        (started.count(), finished.count()),
        (1, 0),
        "cancelled mid-run"
    );
    let record = server.record("x-1").await.expect("a record");
    assert_eq!(record.status, Status::Pending);
    let duplicate = server.post("/exports", "x-1", "{}").await;
    assert_problem(&duplicate, StatusCode::CONFLICT);
}

// The request limit (413) and the largest stored response are two settings.
async fn the_request_and_stored_response_limits_are_separate_settings(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move |body: Bytes| {
            let runs = runs.clone();
            async move {
                runs.next();
                (StatusCode::CREATED, body.repeat(100))
            }
        })
    };
    let limited = layer(&harness)
        .max_request_bytes(64)
        .max_stored_response_bytes(1_000);
    let router = Router::new().route("/echo", handler.layer(limited));
    let server = Server::start(harness, router).await;

    let too_large = server.post("/echo", "e-1", &"r".repeat(65)).await;
    assert_problem(&too_large, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs.count(), 0);
    assert!(server.record("e-1").await.is_none());

    // 64 bytes in, 6,400 out: over the stored limit, so processed without its body.
    let first = server.post("/echo", "e-2", &"r".repeat(64)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.bytes().len(), 6_400);
    let retry = server.post("/echo", "e-2", &"r".repeat(64)).await;
    assert_processed_not_replayable(&retry, Some(201));
    // 5 bytes in, 500 out: stored and replayed.
    let small = server.post("/echo", "e-3", "small").await;
    let again = server.post("/echo", "e-3", "small").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.bytes(), small.bytes());
    assert_eq!(runs.count(), 2);
}

/// A memory store whose completions never land (the store down for them), so that a call's result
/// cannot be stored; with `panics`, a completion panics instead.
#[derive(Debug, Default)]
struct CompletionsDown {
    panics: bool,
}

#[async_trait::async_trait]
impl Override<MemoryStore> for CompletionsDown {
    fn kind(&self) -> &'static str {
        "completions-down"
    }

    async fn transition(
        &self,
        records: &MemoryStore,
        transition: &idempotent_runtime::store::Transition<'_>,
    ) -> Result<idempotent_runtime::store::WriteOutcome, StoreError> {
        if matches!(
            transition.change,
            idempotent_runtime::store::Change::Complete { .. }
        ) {
            assert!(!self.panics, "the store's client panicked");
            return Err(StoreError::Unavailable("the table is unreachable".into()));
        }
        records.transition(transition).await
    }
}

// A handler that ran but whose response could not be stored (the store down for the whole lease): the
// client gets the handler's own 201, not a 500 inviting it to run the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_could_not_be_stored_still_goes_to_its_caller() {
    let harness = Harness::over(
        Arc::new(Delegating::new(
            MemoryStore::new(),
            CompletionsDown::default(),
        )),
        idempotent_tests::RequestCounter::default(),
        |b| b.default_lease(Duration::from_secs(1)),
    );
    let runs = Runs::default();
    let router = Router::new().route("/payments", charge(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server.post("/payments", "down", "{}").await;
    assert_eq!(
        (first.status, first.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..]),
        "{first:?}"
    );
    assert_eq!(runs.count(), 1);
}

// A response body that panics after the handler answered 201 is a body that failed mid-stream: the
// outcome is final (COMPLETED without the body), the retry gets the 410, and the handler ran once.
async fn a_body_that_panics_after_a_stored_status_is_final(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move || {
            let runs = runs.clone();
            async move {
                runs.next();
                let stream = futures_util::stream::poll_fn(
                    |_| -> std::task::Poll<Option<Result<Bytes, std::io::Error>>> {
                        panic!("the export's serializer panicked")
                    },
                );
                (StatusCode::CREATED, Body::from_stream(stream))
            }
        })
    };
    let router = Router::new().route("/exports", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server
        .send(
            server
                .request("/exports", "p-1")
                .header(header::CONTENT_TYPE, "application/json"),
            "{}",
        )
        .await;
    if let Ok(first) = &first {
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        assert!(first.body.is_err(), "{first:?}");
    }
    let record = server.record("p-1").await.expect("a record");
    assert_eq!(record.status, Status::Completed, "{record:?}");
    let retry = server.post("/exports", "p-1", "{}").await;
    assert_processed_not_replayable(&retry, Some(201));
    assert_eq!(runs.count(), 1);
}

// A panic outside the handler (here in the store's client, after the handler ran) ends the request's
// task: the service still answers 500 problem+json instead of a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_outside_the_handler_still_answers_500() {
    let store = Delegating::new(MemoryStore::new(), CompletionsDown { panics: true });
    let harness = Harness::over(
        Arc::new(store),
        idempotent_tests::RequestCounter::default(),
        |b| b,
    );
    let runs = Runs::default();
    let router = Router::new().route("/payments", charge(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server
        .send(
            server
                .request("/payments", "store-panic")
                .header(header::CONTENT_TYPE, "application/json"),
            "{}",
        )
        .await
        .expect("an answer, not a dropped connection");
    assert_problem(&first, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.count(), 1);
}

// A service mounted with `nest_service` behind a middleware that picks the version's route from a
// header (`Api-Version`): the outer router had recorded the URI the client sent (`/api/payments`) for
// both versions, so the layer fingerprinted them alike, and v2's payment got v1's 201 replayed.
async fn a_rewritten_route_never_replays_another_routes_response(backend: Backend) {
    let harness = Harness::new(backend).await;
    let (v1, v2) = (Runs::default(), Runs::default());
    let versions = Router::new()
        .route("/v1/payments", charge(&v1).layer(layer(&harness)))
        .route("/v2/payments", charge(&v2).layer(layer(&harness)));
    let versioned = Router::new()
        .fallback_service(versions)
        .layer(axum::middleware::map_request(
            |mut request: Request<Body>| async move {
                let version = request
                    .headers()
                    .get("api-version")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("1")
                    .to_owned();
                let path = format!("/v{version}{}", request.uri().path());
                *request.uri_mut() = path.parse().unwrap();
                request
            },
        ));
    let router = Router::new().nest_service("/api", versioned);
    let server = Server::start(harness, router).await;

    let first = server.post("/api/payments", "k-1", "{}").await;
    assert_eq!(
        (first.status, first.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..])
    );
    let other = server
        .send(
            server
                .request("/api/payments", "k-1")
                .header(header::CONTENT_TYPE, "application/json")
                .header("api-version", "2"),
            "{}",
        )
        .await
        .unwrap();
    assert_eq!(
        other.header("idempotent-replayed"),
        None,
        "v1's response replayed to a v2 request: {other:?}"
    );
    assert_problem(&other, StatusCode::UNPROCESSABLE_ENTITY);
    let again = server.post("/api/payments", "k-1", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!((v1.count(), v2.count()), (1, 0));
}

// The same bytes sent as a gzip-encoded body and as a plain one (an upload of a `.gz` file) are two
// requests: the body's `Content-Encoding` says what the bytes mean. The second got the first's response.
async fn identical_bytes_in_another_content_encoding_are_another_request(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let handler = {
        let runs = runs.clone();
        post(move |headers: HeaderMap, body: Bytes| {
            let runs = runs.clone();
            async move {
                runs.next();
                let encoding = headers
                    .get(header::CONTENT_ENCODING)
                    .map_or("identity", |v| v.to_str().unwrap())
                    .to_owned();
                (
                    StatusCode::CREATED,
                    format!("{} bytes stored as {encoding}", body.len()),
                )
            }
        })
    };
    let router = Router::new().route("/uploads", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let gzip = "\u{1f}\u{8b}\u{8}\u{0}";

    let encoded = server
        .send(
            server
                .request("/uploads", "u-1")
                .header(header::CONTENT_ENCODING, "gzip"),
            gzip,
        )
        .await
        .unwrap();
    assert_eq!(encoded.status, StatusCode::CREATED);
    let plain = server
        .send(server.request("/uploads", "u-1"), gzip)
        .await
        .unwrap();
    assert_eq!(
        plain.header("idempotent-replayed"),
        None,
        "the gzip upload's response replayed to a plain one: {plain:?}"
    );
    assert_problem(&plain, StatusCode::UNPROCESSABLE_ENTITY);
    let again = server
        .send(
            server
                .request("/uploads", "u-1")
                .header(header::CONTENT_ENCODING, "gzip"),
            gzip,
        )
        .await
        .unwrap();
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(runs.count(), 1);
}

// A `Content-Disposition` whose file name is UTF-8 (`filename="résumé.pdf"`, as browsers and most
// frameworks send it) was not stored, so the replay came without it and the download lost its name.
async fn utf8_representation_headers_are_replayed(backend: Backend) {
    let harness = Harness::new(backend).await;
    let disposition = "attachment; filename=\"résumé.pdf\"";
    let handler = post(move || async move {
        let mut response = (StatusCode::CREATED, "%PDF-1.7").into_response();
        response.headers_mut().insert(
            header::CONTENT_DISPOSITION,
            header::HeaderValue::from_bytes(disposition.as_bytes()).unwrap(),
        );
        response
    });
    let router = Router::new().route("/documents", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server.post("/documents", "d-1", "{}").await;
    let again = server.post("/documents", "d-1", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    for reply in [&first, &again] {
        assert_eq!(
            reply
                .headers
                .get(header::CONTENT_DISPOSITION)
                .map(header::HeaderValue::as_bytes),
            Some(disposition.as_bytes()),
            "{reply:?}"
        );
    }
}

// A streamed response (server-sent events, a long export) reaches its first caller only once its body
// has ended or passed the stored limit: the layer reads it for the record before it hands the response
// on, so the head and the first events wait for the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the layer buffers a stored response before its caller sees the head; streaming it through while it is recorded is a redesign of the first caller's path"]
async fn a_streamed_response_reaches_its_caller_as_it_is_produced() {
    let harness = Harness::new(Backend::Memory).await;
    let handler = post(|| async {
        let events = futures_util::stream::unfold(0, |n| async move {
            if n > 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            (n < 2).then(|| {
                (
                    Ok::<_, std::io::Error>(Bytes::from(format!("data: {n}\n\n"))),
                    n + 1,
                )
            })
        });
        (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from_stream(events),
        )
    });
    let router = Router::new().route("/completions", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let request = server
        .request("/completions", "s-1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let started = tokio::time::Instant::now();
    let response = server.client.request(request).await.unwrap();
    let head = started.elapsed();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let first_event = started.elapsed();
    assert_eq!(first.as_ref(), b"data: 0\n\n");
    assert!(
        head < Duration::from_secs(1) && first_event < Duration::from_secs(1),
        "the head came after {head:?}, the first event after {first_event:?}"
    );
}

// A request body whose stream failed (a body timeout in front of the layer, as tower-http's
// `RequestBodyTimeoutLayer` ends a slow upload; malformed chunked framing) was answered 413 "over
// 1048576 bytes" for a body of a few bytes: a client told its request is too large shrinks it instead
// of sending it again.
async fn a_request_body_that_fails_is_400_not_413(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let router = Router::new()
        .route("/payments", charge(&runs).layer(layer(&harness)))
        .layer(axum::middleware::map_request(
            |request: Request<Body>| async move {
                let stalled = request.headers().contains_key("x-stall");
                let (parts, body) = request.into_parts();
                let body = if stalled {
                    Body::from_stream(futures_util::stream::iter([
                        Ok(Bytes::from_static(b"{")),
                        Err(std::io::Error::other("request body timed out")),
                    ]))
                } else {
                    body
                };
                Request::from_parts(parts, body)
            },
        ));
    let server = Server::start(harness, router).await;
    let stalled = server
        .send(
            server
                .request("/payments", "t-1")
                .header(header::CONTENT_TYPE, "application/json")
                .header("x-stall", "1"),
            "{}",
        )
        .await
        .unwrap();
    assert_problem(&stalled, StatusCode::BAD_REQUEST);
    assert_eq!(runs.count(), 0);
    let whole = server.post("/payments", "t-1", "{}").await;
    assert_eq!(
        (whole.status, whole.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..])
    );
}

// The identity function runs in the service's own future, before any claim: its panic reached hyper,
// which closed the connection without an answer.
async fn a_panicking_identity_function_answers_500_and_leaves_the_key_free(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let layer = IdempotencyLayer::new(
        harness.idem.clone(),
        |parts: &axum::http::request::Parts| {
            assert!(
                !parts.headers.contains_key("x-broken-token"),
                "the token's claims did not parse"
            );
            Some(TENANT.to_owned())
        },
    )
    .namespace(NAMESPACE);
    let router = Router::new().route("/payments", charge(&runs).layer(layer));
    let server = Server::start(harness, router).await;
    let broken = server
        .send(
            server
                .request("/payments", "i-1")
                .header(header::CONTENT_TYPE, "application/json")
                .header("x-broken-token", "1"),
            "{}",
        )
        .await
        .expect("an answer, not a dropped connection");
    assert_problem(&broken, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(runs.count(), 0);
    assert!(server.record("i-1").await.is_none(), "nothing claimed");
    let fixed = server.post("/payments", "i-1", "{}").await;
    assert_eq!(
        (fixed.status, fixed.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..]),
        "{fixed:?}"
    );
}

// A `Content-Disposition` whose file name is Latin-1 (`filename="r\xe9sum\xe9.pdf"`, as older servers
// and some frameworks send it) is a valid header value that is not UTF-8: the first caller got it, the
// retry did not.
async fn header_values_that_are_not_utf8_are_replayed_byte_for_byte(backend: Backend) {
    let harness = Harness::new(backend).await;
    let disposition: &[u8] = b"attachment; filename=\"r\xe9sum\xe9.pdf\"";
    let handler = post(move || async move {
        let mut response = (StatusCode::CREATED, "%PDF-1.7").into_response();
        response.headers_mut().insert(
            header::CONTENT_DISPOSITION,
            header::HeaderValue::from_bytes(disposition).unwrap(),
        );
        response
    });
    let router = Router::new().route("/documents", handler.layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let first = server.post("/documents", "l-1", "{}").await;
    let again = server.post("/documents", "l-1", "{}").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    for reply in [&first, &again] {
        assert_eq!(
            reply
                .headers
                .get(header::CONTENT_DISPOSITION)
                .map(header::HeaderValue::as_bytes),
            Some(disposition),
            "{reply:?}"
        );
    }
}

/// The SHA-256 of an empty body, as the layer fingerprints one.
const EMPTY_BODY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// A record the layer did not write (another service sharing the table, a tampered item) holds a
// `Set-Cookie` header: the layer never stores one, and its replay must not send it either.
async fn a_replay_sends_only_the_headers_the_layer_stores(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    // The stored response as the layer writes one, with headers it would never have stored.
    let crafted = serde_json::json!({
        "status": 201,
        "headers": [
            ["content-type", "text/plain"],
            ["set-cookie", "session=attacker; Path=/; HttpOnly"],
            ["x-internal", "1"],
        ],
        "body": { "text": "charge 0" },
        "trailers": [
            ["grpc-status", "0"],
            ["set-cookie", "late=attacker"],
            ["content-length", "999"],
        ],
    });
    let fingerprint = vec![
        "POST".to_owned(),
        "/payments".to_owned(),
        EMPTY_BODY_SHA256.to_owned(),
    ];
    harness
        .idem
        .operation(NAMESPACE, &(TENANT.to_owned(), "c-1".to_owned()))
        .payload(&fingerprint)
        .run(|_| async { Ok::<_, idempotent_runtime::Error>(crafted) })
        .await
        .unwrap();
    let router = Router::new().route("/payments", charge(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let replay = server
        .send(server.request("/payments", "c-1"), "")
        .await
        .unwrap();
    assert_eq!(
        replay.header("idempotent-replayed"),
        Some("true"),
        "{replay:?}"
    );
    assert_eq!(
        (replay.status, replay.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 0"[..])
    );
    assert_eq!(replay.header("content-type"), Some("text/plain"));
    assert_eq!(replay.header("set-cookie"), None, "{replay:?}");
    assert_eq!(replay.header("x-internal"), None, "{replay:?}");
    // Of the trailers, only those the layer stores are named for sending.
    assert_eq!(replay.header("trailer"), Some("grpc-status"), "{replay:?}");
    assert_eq!(runs.count(), 0);
}

/// A handler that counts its runs and answers 201 with the run's number and the body's length.
fn upload(runs: &Runs) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move |body: Bytes| {
        let runs = runs.clone();
        async move {
            let run = runs.next();
            (
                StatusCode::CREATED,
                format!("upload {run}: {} bytes", body.len()),
            )
        }
    })
}

/// `content` as Python's `gzip.compress(content)` encodes it at Unix time `mtime`: compression level
/// 9 (`XFL` 2), no file name, operating system 255 ("unknown"), the time in the header.
fn python_gzip(content: &[u8], mtime: u32) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::GzBuilder::new()
        .mtime(mtime)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(content).unwrap();
    let bytes = encoder.finish().unwrap();
    let mut header = vec![0x1f, 0x8b, 0x08, 0x00];
    header.extend(mtime.to_le_bytes());
    header.extend([0x02, 0xff]);
    assert_eq!(bytes[..10], header[..], "gzip.compress's header");
    bytes
}

// The same JSON sent twice, gzip-encoded each time by Python's `gzip.compress`, one second apart: the
// bodies differ only in the header's timestamp, and the retry got 422 "use a new key" instead of the
// replay (a client that followed the advice ran the request twice).
async fn a_retry_gzipped_again_is_replayed(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let router = Router::new().route("/uploads", upload(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let content = br#"{"amount": 4200, "currency": "eur"}"#;
    let send = |key: &'static str, body: Vec<u8>| {
        let request = server
            .request("/uploads", key)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let client = server.client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            Reply {
                status,
                headers,
                body: Ok(body),
            }
        }
    };
    let first = send("z-1", python_gzip(content, 1_765_000_000)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = send("z-1", python_gzip(content, 1_765_000_001)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.bytes(), first.bytes());
    // Another content under the same key is still another request.
    let other = send("z-1", python_gzip(br#"{"amount": 9900}"#, 1_765_000_002)).await;
    assert_problem(&other, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.count(), 1);
}

/// A form as requests and urllib3 encode it (`requests.post(url, files=..)`), with `boundary`.
fn multipart_form(boundary: &str, amount: &str) -> String {
    format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"amount\"\r\n\r\n{amount}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"receipt\"; filename=\"receipt.txt\"\r\n\
         Content-Type: text/plain\r\n\r\npaid in full\r\n\
         --{boundary}--\r\n"
    )
}

// The same form sent twice, each encoding drawing its own random boundary as urllib3 does: the retry got
// 422 instead of the replay.
async fn a_retry_with_a_new_multipart_boundary_is_replayed(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let router = Router::new().route("/uploads", upload(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let send = async |boundary: &str, amount: &str| {
        server
            .send(
                server.request("/uploads", "f-1").header(
                    header::CONTENT_TYPE,
                    format!("multipart/form-data; boundary={boundary}"),
                ),
                &multipart_form(boundary, amount),
            )
            .await
    };
    let first = send("9c1f0b6e2a7d4e58b3a0c6d1e2f3a4b5", "4200")
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let retry = send("f0e1d2c3b4a5968778695a4b3c2d1e0f", "4200")
        .await
        .unwrap();
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.bytes(), first.bytes());
    let other = send("0123456789abcdef0123456789abcdef", "9900")
        .await
        .unwrap();
    assert_problem(&other, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.count(), 1);
}

// A service's own fingerprint: its JSON bodies compared by meaning, and an `Api-Version` header that
// makes the same body another request. A fingerprint function that panics answers 500 and claims nothing.
async fn a_fingerprint_of_the_services_own_decides_what_is_the_same_request(backend: Backend) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let layer = layer(&harness).fingerprint(|parts, body| {
        assert!(
            !parts.headers.contains_key("x-broken"),
            "the fingerprint broke"
        );
        let canonical = serde_json::from_slice::<Value>(body).map(|json| json.to_string());
        let mut fingerprint = idempotent_runtime::http::request_fingerprint(
            parts,
            canonical.as_ref().map_or(body, String::as_bytes),
        );
        let version = parts
            .headers
            .get("api-version")
            .map(|v| v.as_bytes().to_vec());
        fingerprint.push(format!("api-version {version:?}"));
        fingerprint
    });
    let router = Router::new().route("/payments", charge(&runs).layer(layer));
    let server = Server::start(harness, router).await;
    let first = server
        .post("/payments", "j-1", r#"{"amount":5,"currency":"eur"}"#)
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = server
        .post("/payments", "j-1", r#"{ "currency": "eur", "amount": 5 }"#)
        .await;
    assert_eq!(
        reordered.header("idempotent-replayed"),
        Some("true"),
        "{reordered:?}"
    );
    assert_eq!(reordered.bytes(), first.bytes());
    let versioned = server
        .send(
            server
                .request("/payments", "j-1")
                .header(header::CONTENT_TYPE, "application/json")
                .header("api-version", "2026-01-01"),
            r#"{"amount":5,"currency":"eur"}"#,
        )
        .await
        .unwrap();
    assert_problem(&versioned, StatusCode::UNPROCESSABLE_ENTITY);
    let broken = server
        .send(
            server
                .request("/payments", "j-2")
                .header(header::CONTENT_TYPE, "application/json")
                .header("x-broken", "1"),
            "{}",
        )
        .await
        .expect("an answer, not a dropped connection");
    assert_problem(&broken, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(server.record("j-2").await.is_none(), "nothing claimed");
    assert_eq!(runs.count(), 1);
}

// With `optional()`, a request without a key passes through without idempotency; one whose key is
// present but malformed is still a 400, and its handler does not run: the client meant to send a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_lets_a_missing_key_through_never_a_malformed_one() {
    let harness = Harness::new(Backend::Memory).await;
    let runs = Runs::default();
    let router = Router::new().route("/payments", charge(&runs).layer(layer(&harness).optional()));
    let server = Server::start(harness, router).await;
    for malformed in ["\"\"", "\"open", &"k".repeat(256)] {
        let reply = server.post("/payments", malformed, "{}").await;
        assert_problem(&reply, StatusCode::BAD_REQUEST);
    }
    assert_eq!(runs.count(), 0);
    let keyless = server
        .send(
            Request::post(format!("http://{}/payments", server.addr))
                .header(header::CONTENT_TYPE, "application/json"),
            "{}",
        )
        .await
        .unwrap();
    assert_eq!(
        (keyless.status, keyless.bytes().as_ref()),
        (StatusCode::CREATED, &b"charge 1"[..])
    );
}

/// Which protocol a connection of its own speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    /// HTTP/2 with prior knowledge (h2c), as gRPC clients and proxies speak it to a service.
    Http2,
}

/// A request body of data frames, then trailers.
type Framed = http_body_util::StreamBody<
    futures_util::stream::Iter<
        std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    >,
>;

fn framed(data: &'static str, trailers: Option<HeaderMap>) -> Framed {
    let mut frames = vec![Ok(hyper::body::Frame::data(Bytes::from_static(
        data.as_bytes(),
    )))];
    frames.extend(trailers.map(|t| Ok(hyper::body::Frame::trailers(t))));
    http_body_util::StreamBody::new(futures_util::stream::iter(frames))
}

/// Sends `request` over a new connection to `addr` speaking `protocol`; its reply and trailers.
async fn send_on_own_connection(
    addr: SocketAddr,
    protocol: Protocol,
    request: Request<Framed>,
) -> (Reply, Option<HeaderMap>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let response = match protocol {
        Protocol::Http1 => {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(connection);
            sender.send_request(request).await.unwrap()
        }
        Protocol::Http2 => {
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(connection);
            sender.send_request(request).await.unwrap()
        }
    };
    let status = response.status();
    let headers = response.headers().clone();
    let collected = response.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    let reply = Reply {
        status,
        headers,
        body: Ok(collected.to_bytes()),
    };
    (reply, trailers)
}

/// A gRPC-style handler: reads the request's trailers, answers 201 with a body and trailers
/// (`grpc-status`, and the request's checksum trailer echoed), naming them in `Trailer`.
fn with_trailers(runs: &Runs) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move |request: Request<Body>| {
        let runs = runs.clone();
        async move {
            let run = runs.next();
            let collected = request.into_body().collect().await.unwrap();
            let checksum = collected
                .trailers()
                .and_then(|t| t.get("x-checksum").cloned())
                .unwrap_or_else(|| header::HeaderValue::from_static("none"));
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", header::HeaderValue::from_static("0"));
            trailers.insert("x-request-checksum", checksum);
            trailers.insert(
                header::SET_COOKIE,
                header::HeaderValue::from_static("late=1"),
            );
            let frames: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = vec![
                Ok(hyper::body::Frame::data(Bytes::from(format!(
                    "run {run}: {} bytes",
                    collected.to_bytes().len()
                )))),
                Ok(hyper::body::Frame::trailers(trailers)),
            ];
            Response::builder()
                .status(StatusCode::CREATED)
                .header(header::CONTENT_TYPE, "application/grpc")
                .header(header::TRAILER, "grpc-status, x-request-checksum")
                .body(Body::new(http_body_util::StreamBody::new(
                    futures_util::stream::iter(frames),
                )))
                .unwrap()
        }
    })
}

// The body's trailers were dropped on the way in (the request was rebuilt from its data frames), on
// the replay, and over HTTP/1.1 for the first caller too (its response went out with a
// `Content-Length`, which cannot carry trailers): gRPC's status and checksums were lost.
async fn trailers_pass_through_and_replay(backend: Backend, protocol: Protocol) {
    let harness = Harness::new(backend).await;
    let runs = Runs::default();
    let router = Router::new().route("/rpc", with_trailers(&runs).layer(layer(&harness)));
    let server = Server::start(harness, router).await;
    let request = || {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", header::HeaderValue::from_static("crc32=9a3b"));
        let mut request = Request::post(format!("http://{}/rpc", server.addr))
            .header("idempotency-key", "t-1")
            .header(header::CONTENT_TYPE, "application/grpc");
        if protocol == Protocol::Http1 {
            request = request
                .header(header::TE, "trailers")
                .header(header::TRAILER, "x-checksum");
        }
        request.body(framed("hello", Some(trailers))).unwrap()
    };
    let (first, first_trailers) = send_on_own_connection(server.addr, protocol, request()).await;
    let (again, again_trailers) = send_on_own_connection(server.addr, protocol, request()).await;
    assert_eq!(first.header("idempotent-replayed"), None, "{first:?}");
    assert_eq!(
        again.header("idempotent-replayed"),
        Some("true"),
        "{again:?}"
    );
    for (reply, trailers) in [(&first, &first_trailers), (&again, &again_trailers)] {
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        assert_eq!(reply.bytes().as_ref(), b"run 1: 5 bytes", "{reply:?}");
        let trailers = trailers
            .as_ref()
            .unwrap_or_else(|| panic!("{protocol:?}: no trailers: {reply:?}"));
        assert_eq!(trailers.get("grpc-status").unwrap(), "0", "{trailers:?}");
        assert_eq!(
            trailers.get("x-request-checksum").unwrap(),
            "crc32=9a3b",
            "{protocol:?}: the request's trailer did not reach the handler: {trailers:?}"
        );
    }
    // A trailer about the moment (hyper's HTTP/1.1 drops it; HTTP/2 passes it to the first caller, as
    // without the layer) is not stored.
    let replayed = again_trailers.unwrap();
    assert!(replayed.get(header::SET_COOKIE).is_none(), "{replayed:?}");
    assert_eq!(runs.count(), 1);
}

async fn trailers_pass_through_and_replay_over_http1(backend: Backend) {
    trailers_pass_through_and_replay(backend, Protocol::Http1).await;
}

async fn trailers_pass_through_and_replay_over_http2(backend: Backend) {
    trailers_pass_through_and_replay(backend, Protocol::Http2).await;
}

// Over HTTP/2 a client that gives up resets its stream (`RST_STREAM`) or closes the connection: hyper
// drops the handler's future, as on an HTTP/1 EOF. The handler runs to completion on its own task, its
// response is stored, and the retry (over HTTP/2 as well) is its replay.
async fn a_client_that_resets_its_http2_stream_does_not_cancel_the_handler(backend: Backend) {
    let harness = Harness::with(backend, |b| b.default_lease(Duration::from_secs(1))).await;
    let charges = Runs::default();
    let router = slow_charge(&harness, &charges);
    let server = Server::start(harness, router).await;

    let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(connection);
    let request = Request::post(format!("http://{}/payments", server.addr))
        .header("idempotency-key", "h2-hang-up")
        .header(header::CONTENT_TYPE, "application/json")
        .body(framed("{}", None))
        .unwrap();
    let patience = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while charges.count() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the handler never started"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::select! {
        answer = sender.send_request(request) => panic!("the handler answered: {answer:?}"),
        () = patience => {}
    }
    // Dropping the request's future resets its stream; closing the connection ends the rest.
    drop(sender);
    connection.abort();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline
        && server
            .record("h2-hang-up")
            .await
            .is_none_or(|r| r.status != Status::Completed)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.harness.clock.advance(Duration::from_secs(3));
    let request = Request::post(format!("http://{}/payments", server.addr))
        .header("idempotency-key", "h2-hang-up")
        .header(header::CONTENT_TYPE, "application/json")
        .body(framed("{}", None))
        .unwrap();
    let (retry, _) = send_on_own_connection(server.addr, Protocol::Http2, request).await;
    assert_eq!(charges.count(), 1, "charged twice: {retry:?}");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.bytes().as_ref(), b"charge 1");
}

/// 20 identical requests at once: one runs the handler; without `wait` the 19 others get 409 (the first
/// is in flight), with `wait` they get its response, replayed.
async fn identical_requests_at_once_get_409_and_with_wait_the_first_ones_response(
    backend: Backend,
) {
    for wait in [None, Some(Duration::from_secs(5))] {
        let harness = Harness::with(backend, |b| b).await;
        let charges = Runs::default();
        let handler = {
            let charges = charges.clone();
            post(move || {
                let charges = charges.clone();
                async move {
                    let charge = charges.next();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    (StatusCode::CREATED, format!("charge {charge}"))
                }
            })
        };
        let mut layer = layer(&harness);
        if let Some(wait) = wait {
            layer = layer.wait(wait);
        }
        let router = Router::new().route("/payments", handler.layer(layer));
        let server = Arc::new(Server::start(harness, router).await);
        let replies = futures_util::future::join_all((0..20).map(|_| {
            let server = server.clone();
            async move { server.post("/payments", "order-1", "{}").await }
        }))
        .await;
        let count = |status: StatusCode| replies.iter().filter(|r| r.status == status).count();
        assert_eq!(charges.count(), 1, "wait {wait:?}: {replies:?}");
        if wait.is_none() {
            assert_eq!(
                (count(StatusCode::CREATED), count(StatusCode::CONFLICT)),
                (1, 19),
                "{replies:?}"
            );
        } else {
            assert_eq!(count(StatusCode::CREATED), 20, "{replies:?}");
            assert!(replies.iter().all(|r| r.bytes().as_ref() == b"charge 1"));
            let replayed = replies
                .iter()
                .filter(|r| r.header("idempotent-replayed") == Some("true"))
                .count();
            assert_eq!(replayed, 19, "{replies:?}");
        }
    }
}
